"""`--strategy data_parallel` under JAX: Keras' own data parallelism (`keras.distribution`)
over every device of every process of a run.

The network's and the optimizer's variables are replicated on each device
(`keras.distribution.DataParallel`); each step's global batch is split along its first axis
across the devices, and XLA computes the step on the global batch: its gradients, and its
BatchNorm statistics over the whole batch, are those of one device training the same batch,
to float rounding. Each process reads its own part of every global batch (`shard`) and the
parts are put together into one global array (`jax.make_array_from_process_local_data`);
process 0 alone writes the checkpoints, logs and summary, the same files as one device's.

Several processes (several machines, or one process per GPU) join through JAX's distributed
runtime (`keras.distribution.initialize`): each is started with the coordinator's address
(process 0's host and a free port), the number of processes and its own id, as `train`'s
`--coordinator`, `--processes` and `--process-id` or Keras' environment variables
(`ENVIRONMENT`). A process that ends while the others train ends them too (`PeerLost`).
"""

import os

import keras
import numpy as np

from ..failures import PeerLost

# Keras' environment variables for `keras.distribution.initialize`, each the value of one of
# train's flags: the coordinator's address (the first of a comma-separated list), the number
# of processes, this process's id.
ENVIRONMENT = {
    "coordinator": "KERAS_DISTRIBUTION_JOB_ADDRESSES",
    "processes": "KERAS_DISTRIBUTION_NUM_PROCESSES",
    "process_id": "KERAS_DISTRIBUTION_PROCESS_ID",
}


def check_processes(coordinator, processes, process_id):
    """Raises ValueError, naming what was received, for settings of several processes that do
    not fit together: all three or none (or the environment's), a count of at least 1, an id
    below it, an address of the form HOST:PORT."""
    given = {"--coordinator": coordinator, "--processes": processes, "--process-id": process_id}
    if all(value is None for value in given.values()):
        return
    missing = [flag for flag, value in given.items() if value is None]
    if missing:
        raise ValueError(
            f"Several processes need --coordinator HOST:PORT, --processes N and --process-id I together. "
            f"Received: {', '.join(f'{flag}={value!r}' for flag, value in given.items())}"
        )
    host, separator, port = coordinator.rpartition(":")
    if not separator or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--coordinator must be HOST:PORT (process 0's). Received: --coordinator={coordinator!r}")
    if processes < 1 or not 0 <= process_id < processes:
        raise ValueError(
            f"--processes must be at least 1 and --process-id from 0 to --processes - 1. "
            f"Received: --processes={processes}, --process-id={process_id}"
        )


def initialize(coordinator=None, processes=None, process_id=None):
    """Joins this process to the run's others (`keras.distribution.initialize`) where the flags
    or Keras' environment variables name several processes; before any JAX computation.

    Raises:
        ValueError: for settings that do not fit together (`check_processes`), or a backend
            other than JAX.
    """
    check_processes(coordinator, processes, process_id)
    from_environment = all(os.environ.get(name) for name in ENVIRONMENT.values())
    if coordinator is None and not from_environment:
        return
    if keras.backend.backend() != "jax":
        raise ValueError(
            f"Several processes of --strategy data_parallel run under KERAS_BACKEND=jax. Received: "
            f"KERAS_BACKEND={keras.backend.backend()}; under TensorFlow, --strategy multi_worker with TF_CONFIG."
        )
    keras.distribution.initialize(coordinator, processes, process_id)


class DataParallel:
    """The devices of every process as one `keras.distribution.DataParallel`, set as Keras'
    distribution before the network is built.

    Raises:
        ValueError: if the global batch does not divide over the devices.
    """

    def __init__(self, config):
        import jax

        devices = keras.distribution.list_devices()
        if config.batch_size % len(devices):
            raise ValueError(
                f"batch_size must be divisible by the number of devices ({len(devices)}: {', '.join(devices)}). "
                f"Received: batch_size={config.batch_size}"
            )
        self.distribution = keras.distribution.DataParallel(devices=devices)
        keras.distribution.set_distribution(self.distribution)
        self.devices, self.process, self.processes = len(devices), jax.process_index(), jax.process_count()
        self.chief = self.process == 0

    @property
    def shard(self):
        """(this process's index, the number of processes): its part of every global batch."""
        return self.process, self.processes

    def global_batch(self, *arrays):
        """Each process's part of a batch (arrays with the batch first) as one global array,
        split across every device along the batch."""
        import jax

        return [
            jax.make_array_from_process_local_data(
                self.distribution.get_data_layout(array.shape).backend_layout, np.asarray(array)
            )
            for array in arrays
        ]

    def replicated(self, array):
        """An array every process holds whole (an evaluation batch), replicated on every device."""
        import jax

        layout = keras.distribution.TensorLayout([None] * np.ndim(array), self.distribution.device_mesh)
        return jax.make_array_from_process_local_data(layout.backend_layout, np.asarray(array))

    def guarded(self, step):
        """`step()`, where an error of JAX's collectives in a run of several processes (another
        process ended) becomes `PeerLost`."""
        try:
            return step()
        except Exception as error:
            if self.processes == 1:
                raise
            raise PeerLost(
                f"process {self.process} of {self.processes} lost another process of the run "
                f"({' '.join(str(error).split())[:160]}): start every process again to resume from the last "
                "checkpoint"
            ) from None
