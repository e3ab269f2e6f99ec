"""TF Serving's request batching: the requests that wait while the network is busy run as one call."""

import asyncio
import collections
import concurrent.futures

from .requests import MAX_REQUEST_PIXELS

# Threads that run the network; each batch uses every core through the runtime's own
# threads, two keep the cores busy while the other thread converts and answers.
INFERENCE_THREADS = 2


class Batcher:
    """Runs the network for `Parsed` requests on `threads` threads, off the event loop.

    With `batching`, the requests of one signature that wait while every thread is busy
    go to the network together, up to `max_batch` instances and MAX_REQUEST_PIXELS
    (TF Serving's request batching): a lone request waits for nothing, and under load
    one call serves many requests. Runs on the event loop's thread only.
    """

    def __init__(self, model, threads=INFERENCE_THREADS, batching=True):
        self.model, self.batching = model, batching
        self.pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="inference")
        self.idle_threads = threads
        self.waiting = collections.deque()  # (Parsed, future)
        self.running = set()  # the event loop keeps only weak references to its tasks

    async def infer(self, parsed):
        """The outputs of the network for `parsed`, or the BadRequest it gets. Cancelled
        while it waits, `parsed` is never run."""
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((parsed, future))
        self.dispatch()
        return await future

    def dispatch(self):
        """Starts a call on every idle thread while requests wait, leaving out those whose
        `infer` was cancelled (their client has gone). Where assembling a batch fails, the
        first waiting request runs alone: a request that cannot be run is answered with its
        error (a 500) by `run`, and every slot comes back."""
        self.waiting = collections.deque(entry for entry in self.waiting if not entry[1].cancelled())
        while self.waiting and self.idle_threads:
            try:
                batch = self.next_batch()
            except Exception:
                batch = [self.waiting.popleft()]
            self.idle_threads -= 1
            task = asyncio.ensure_future(self.run(batch))
            self.running.add(task)
            task.add_done_callback(self.running.discard)

    def next_batch(self):
        """The first waiting request and, with batching, every later one of its signature that
        fits within max_batch instances and MAX_REQUEST_PIXELS. Chosen by position before the
        queue changes: if choosing fails, nothing has left the queue."""
        waiting = list(self.waiting)
        chosen = [0]
        if self.batching:
            first = waiting[0][0]
            instances, pixels = len(first), first.pixels
            for index, (parsed, _) in enumerate(waiting[1:], start=1):
                if (
                    parsed.signature == first.signature
                    and instances + len(parsed) <= self.model.max_batch
                    and pixels + parsed.pixels <= MAX_REQUEST_PIXELS
                ):
                    chosen.append(index)
                    instances, pixels = instances + len(parsed), pixels + parsed.pixels
        taken = set(chosen)
        self.waiting = collections.deque(entry for index, entry in enumerate(waiting) if index not in taken)
        return [waiting[index] for index in chosen]

    async def run(self, batch):
        try:
            results = await asyncio.get_running_loop().run_in_executor(
                self.pool, self.model.infer, [parsed for parsed, _ in batch]
            )
            if len(results) != len(batch):
                raise RuntimeError(f"The network answered {len(results)} of the batch's {len(batch)} requests.")
            for (_, future), result in zip(batch, results):
                if not future.done():
                    future.set_result(result)
        except Exception as error:
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
        finally:
            self.idle_threads += 1
            self.dispatch()
