"""Serving exported models over TF Serving's REST API: `keras-preact serve`.

    requests.py            a :predict body read, bounded and checked; an answer written
    model.py               ModelServer: one exported version and TF Serving's semantics over it
    tensorflow_runtime.py  the SavedModel's signatures on TensorFlow
    onnx_runtime.py        the same signatures on onnxruntime, with images.py's decoding
    images.py              encoded images to the network's input with simplejpeg, Pillow and NumPy
    containers.py          the image files both runtimes decode alike, told before decoding
    batching.py            the requests that wait while the network is busy, run as one call
    memory.py              memory a large request freed, given back to the system
    application.py         the Starlette application: routes, errors as JSON, the in-flight bound
    connections.py         HTTP/1.1 connections on h11: a deadline, a bound, JSON errors
    server.py              serve(): asyncio on a listening socket, the runtime chosen

The exported model's contract (its signatures, files and metadata) is
`keras_preact_training.export.contract`, which export writes and serving reads. The onnxruntime
runtime imports neither TensorFlow nor Keras: a deployment that serves ONNX models needs only onnxruntime, NumPy, Pillow, simplejpeg, Starlette and h11.
"""
