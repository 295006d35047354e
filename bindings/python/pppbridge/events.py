"""Events from the library's thread to the program's: a blocking queue and asyncio iterators.

The library calls back on its own thread; nothing of the program's runs there unless it asked
(`on_library_thread`). Each event is put in a bounded queue for `next_event()` and handed to
every `events()` iterator's own asyncio loop with `call_soon_threadsafe`. A consumer that never
takes its events loses the oldest once `limit` are waiting, and `dropped` counts them.
"""
import asyncio
import collections
import threading


class EventQueue:
    def __init__(self, limit=10000):
        self._limit = limit
        self._waiting = collections.deque()
        self._condition = threading.Condition()
        self._subscribers = []  # (loop, asyncio.Queue)
        self.dropped = 0

    def put(self, event):
        """From the library's thread."""
        with self._condition:
            if len(self._waiting) >= self._limit:
                self._waiting.popleft()
                self.dropped += 1
            self._waiting.append(event)
            self._condition.notify_all()
            subscribers = list(self._subscribers)
        for loop, queue in subscribers:
            try:
                loop.call_soon_threadsafe(self._deliver, queue, event)
            except RuntimeError:
                # That loop is closed: its iterator is gone with it.
                self._unsubscribe(loop, queue)

    def _deliver(self, queue, event):
        if queue.qsize() >= self._limit:
            queue.get_nowait()
            self.dropped += 1
        queue.put_nowait(event)

    def next(self, timeout=None):
        """The oldest event not yet taken here, waiting up to `timeout` seconds (None: for
        ever); None when none came in time."""
        with self._condition:
            if not self._condition.wait_for(lambda: self._waiting, timeout):
                return None
            return self._waiting.popleft()

    def _unsubscribe(self, loop, queue):
        with self._condition:
            if (loop, queue) in self._subscribers:
                self._subscribers.remove((loop, queue))

    async def iterate(self):
        """Every event from now on, in the calling task's event loop."""
        loop = asyncio.get_running_loop()
        queue = asyncio.Queue()
        with self._condition:
            self._subscribers.append((loop, queue))
        try:
            while True:
                yield await queue.get()
        finally:
            self._unsubscribe(loop, queue)
