"""keras-tuner's distributed mode for `keras-preact tune`: this process's role (chief or
worker) and the chief's address, checked before any data is read (host:port, a host that
resolves, and for a worker a chief that answers), set in keras-tuner's environment variables.
"""

import os
import socket
import time

# keras-tuner's distributed mode: a process is its chief where the tuner id holds "chief".
ORACLE_HOST, ORACLE_PORT, TUNER_ID = "KERASTUNER_ORACLE_IP", "KERASTUNER_ORACLE_PORT", "KERASTUNER_TUNER_ID"
# How long a worker waits for its chief to answer (the chief may still be starting: loading
# TensorFlow and the data) before it ends, and how often it asks.
CHIEF_WAIT_SECONDS = 30
CHIEF_POLL_SECONDS = 0.5


def role():
    """ "chief" or "worker" in keras-tuner's distributed mode (its environment variables set),
    else None."""
    if ORACLE_HOST not in os.environ:
        return None
    return "chief" if "chief" in os.environ.get(TUNER_ID, "") else "worker"


def distribute(chief=None, worker=None, worker_id=None):
    """Sets keras-tuner's distributed mode for this process: the chief serving the oracle at
    `chief` ("host:port"), or a worker named `worker_id` asking the chief at `worker`. A
    worker started again under the same id takes back the trial it was running.

    Raises:
        ValueError: for both roles, an address that is not host:port, a worker without an
            id or with "chief" in it, or keras-tuner's variables half set.
    """
    if worker_id and not worker:
        raise ValueError(f"--worker-id names a worker (with --worker HOST:PORT). Received: --worker-id {worker_id!r}")
    if chief is not None and worker is not None:
        raise ValueError(f"A process is the chief or a worker, not both. Received: --chief {chief} --worker {worker}")
    if chief is None and worker is None:
        partial = [name for name in (ORACLE_HOST, ORACLE_PORT, TUNER_ID) if name in os.environ]
        if partial and len(partial) < 3:
            raise ValueError(
                f"keras-tuner's distributed mode needs {ORACLE_HOST}, {ORACLE_PORT} and {TUNER_ID}. "
                f"Received: only {', '.join(partial)}"
            )
        return
    address = chief if chief is not None else worker
    host, separator, port = address.rpartition(":")
    if not separator or not host or "/" in host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"The chief's address must be host:port, the port 1-65535. Received: {address!r}")
    if worker and (not worker_id or "chief" in worker_id):
        raise ValueError(
            'A worker needs --worker-id, a name of its own without "chief" in it, the same each '
            f"time it starts. Received: --worker-id {worker_id!r}"
        )
    try:
        socket.getaddrinfo(host, int(port), proto=socket.IPPROTO_TCP)
    except OSError as error:
        raise ValueError(f"The chief's host {host!r} does not resolve ({error}). Received: {address!r}") from None
    if worker:
        wait_for_chief(host, int(port), address)
    os.environ.update({ORACLE_HOST: host, ORACLE_PORT: port, TUNER_ID: "chief" if chief else worker_id})


def wait_for_chief(host, port, address):
    """Returns once a connection to the chief at `host`:`port` opens.

    Raises:
        ConnectionError: where none opens within CHIEF_WAIT_SECONDS.
    """
    deadline = time.monotonic() + CHIEF_WAIT_SECONDS
    while True:
        try:
            socket.create_connection((host, port), timeout=CHIEF_POLL_SECONDS).close()
            return
        except OSError as error:
            if time.monotonic() >= deadline:
                raise ConnectionError(
                    f"No chief answers at {address} (asked for {CHIEF_WAIT_SECONDS} s: {error}): start the chief "
                    f"first (`keras-preact tune ... --chief {address}`), then this worker. Received: --worker {address!r}"
                ) from None
            time.sleep(CHIEF_POLL_SECONDS)
