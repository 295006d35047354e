"""Events from the library's thread to the program's: a blocking queue and asyncio iterators.

The library calls back on its own thread; nothing of the program's runs there unless it asked
(`on_library_thread`). Each event is put in a bounded queue for `next()` and handed to every
`iterate()` iterator's own asyncio loop with `call_soon_threadsafe`. A consumer that does not
keep up loses the oldest of its events once `limit` wait (an iterator: the newest, once `limit`
are on their way to a loop that does not run them), and `dropped` counts them.
"""
import asyncio
import collections
import threading


class _Subscriber:
    def __init__(self, loop):
        self.loop = loop
        self.queue = asyncio.Queue()
        self.in_flight = 0  # handed to the loop, not yet run there


class EventQueue:
    def __init__(self, limit=10000):
        self._limit = limit
        self._waiting = collections.deque()
        self._condition = threading.Condition()
        self._subscribers = []
        self.dropped = 0

    def put(self, event):
        """From the library's thread."""
        with self._condition:
            if len(self._waiting) >= self._limit:
                self._waiting.popleft()
                self.dropped += 1
            self._waiting.append(event)
            self._condition.notify_all()
            deliver = []
            for s in self._subscribers:
                if s.in_flight + s.queue.qsize() >= self._limit:
                    self.dropped += 1
                else:
                    s.in_flight += 1
                    deliver.append(s)
        for s in deliver:
            try:
                s.loop.call_soon_threadsafe(self._deliver, s, event)
            except RuntimeError:
                # That loop is closed: its iterator is gone with it.
                self._unsubscribe(s)

    def _deliver(self, s, event):
        with self._condition:
            s.in_flight -= 1
        s.queue.put_nowait(event)

    def next(self, timeout=None):
        """The oldest event not yet taken here, waiting up to `timeout` seconds (None: for
        ever); None when none came in time."""
        with self._condition:
            if not self._condition.wait_for(lambda: self._waiting, timeout):
                return None
            return self._waiting.popleft()

    def _unsubscribe(self, s):
        with self._condition:
            if s in self._subscribers:
                self._subscribers.remove(s)

    async def iterate(self):
        """Every event from now on, in the calling task's event loop."""
        s = _Subscriber(asyncio.get_running_loop())
        with self._condition:
            self._subscribers.append(s)
        try:
            while True:
                yield await s.queue.get()
        finally:
            self._unsubscribe(s)
