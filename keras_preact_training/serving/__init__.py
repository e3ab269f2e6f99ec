"""Serving exported models over TF Serving's REST API: `keras-preact serve`.

    protocol.py            a :predict body read, bounded and checked; an answer written
    model.py               ModelServer: one exported version and TF Serving's semantics over it
    tensorflow_runtime.py  the SavedModel's signatures on TensorFlow
    onnx_runtime.py        the same signatures on onnxruntime, with data/images.py's decoding
    image_formats.py       the image files both runtimes decode alike, told before decoding
    batching.py            the requests that wait while the network is busy, run as one call
    memory.py              memory a large request freed, given back to the system
    application.py         the Starlette application: routes, errors as JSON, the in-flight bound,
                           the body's deadline, the grace of a stopping server
    server.py              serve(): Hypercorn on a listening socket, the runtime chosen
    client.py              `keras-preact query`: a client of a TF Serving REST server

The exported model's contract (its signatures, files and metadata) is
`keras_preact_training.export.contract`, which export writes and serving reads. The onnxruntime
runtime imports neither TensorFlow nor Keras: a deployment that serves ONNX models needs only
onnxruntime, NumPy, Pillow, simplejpeg, Starlette and Hypercorn.
"""

# TF Serving's REST port, the most instances one request may hold, the most :predict
# requests in flight at once (past it: 503), the seconds a request's head and then its body
# each have to arrive (past them: the connection closed, and 408 for the body), and the mebibytes of request bodies held at once (past it: 503). A body costs the
# server about 2.5 times its size until it is answered (docs/benchmarks.md, the server under
# attack), so 256 MiB of bodies keep a 4 GB, 2-core server within its memory.
DEFAULT_PORT = 8501
DEFAULT_MAX_BATCH = 64
DEFAULT_MAX_IN_FLIGHT = 256
DEFAULT_REQUEST_TIMEOUT = 10.0
DEFAULT_MAX_BODY_MEMORY = 256
