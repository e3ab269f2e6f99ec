"""TF Serving's request batching: the requests that wait while the network is busy run as one call."""

import asyncio
import collections
import concurrent.futures

from .protocol import MAX_REQUEST_PIXELS

# Threads that run the network; each batch uses every core through the runtime's own
# threads, two keep the cores busy while the other thread converts and answers.
INFERENCE_THREADS = 2


class Batcher:
    """Runs the network for `Parsed` requests on `threads` threads, off the event loop.

    With `batching`, the requests of one signature that wait while every thread is busy
    go to the network together, up to `max_batch` instances (TF Serving's request batching):
    a lone request waits for nothing, and under load one call serves many requests. Fairness
    counts the pixels decoding costs (`Parsed.pixels`: a JPEG's once a scan): a request that
    costs more than a full batch at the network's own size (`large_pixels`, `model.max_batch` x
    `model.image_pixels`) is large, decoding for up to seconds where the others take
    milliseconds (docs/benchmarks-history.md, "Decoding the largest request on each runtime"); large requests are never batched with
    small ones, a batch of small ones stays within `large_pixels` (many requests just under
    the bound are large work together) and one of large ones within MAX_REQUEST_PIXELS, and
    large requests run on at most `threads - 1` threads at once: however slowly their images
    decode, and however many of them wait, a thread is left for the others. Runs on the event
    loop's thread only.
    """

    def __init__(self, model, threads=INFERENCE_THREADS, batching=True):
        self.model, self.batching = model, batching
        self.large_pixels = model.max_batch * model.image_pixels
        self.pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="inference")
        self.idle_threads = threads
        self.large_threads = max(1, threads - 1)  # the most that may run large requests at once
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
        """Starts a call on every idle thread while requests that may run wait, leaving out
        those whose `infer` was cancelled (their client has gone). Where assembling a batch
        fails, the first waiting request runs alone: a request that cannot be run is answered
        with its error (a 500) by `run`, and every slot comes back."""
        self.waiting = collections.deque(entry for entry in self.waiting if not entry[1].cancelled())
        while self.waiting and self.idle_threads:
            try:
                batch = self.next_batch()
            except Exception:
                batch = [self.waiting.popleft()]
            if not batch:  # only large requests wait, and the threads they may use are busy
                return
            large = self.is_large(batch[0][0])
            self.idle_threads -= 1
            self.large_threads -= large
            task = asyncio.ensure_future(self.run(batch, large))
            self.running.add(task)
            task.add_done_callback(self.running.discard)

    def next_batch(self):
        """The first waiting request that may run (a small one, or a large one while a thread
        for large ones is free) and, with batching, every later one of its signature and size
        that fits within max_batch instances and the pixels of its kind (`Batcher`); [] if none
        may run. Chosen by position before the queue changes: if choosing fails, nothing has
        left the queue."""
        waiting = list(self.waiting)
        runnable = [
            index for index, (parsed, _) in enumerate(waiting) if self.large_threads > 0 or not self.is_large(parsed)
        ]
        if not runnable:
            return []
        chosen = runnable[:1]
        if self.batching:
            first = waiting[chosen[0]][0]
            instances, pixels = len(first), first.pixels
            most_pixels = MAX_REQUEST_PIXELS if self.is_large(first) else self.large_pixels
            for index in range(chosen[0] + 1, len(waiting)):
                parsed = waiting[index][0]
                if (
                    parsed.signature == first.signature
                    and self.is_large(parsed) == self.is_large(first)
                    and instances + len(parsed) <= self.model.max_batch
                    and pixels + parsed.pixels <= most_pixels
                ):
                    chosen.append(index)
                    instances, pixels = instances + len(parsed), pixels + parsed.pixels
        taken = set(chosen)
        self.waiting = collections.deque(entry for index, entry in enumerate(waiting) if index not in taken)
        return [waiting[index] for index in chosen]

    async def run(self, batch, large=False):
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
            self.large_threads += large
            self.dispatch()

    def is_large(self, parsed):
        """Whether decoding the `Parsed` request's images costs more than `large_pixels`."""
        return parsed.pixels > self.large_pixels
