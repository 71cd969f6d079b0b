"""A TCP proxy on loopback between a client and a broker, for a slow or partitioned network
without network namespaces."""

from __future__ import annotations

import asyncio
import threading


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target``; ``delay`` holds every chunk back that long,
    ``blackhole`` stops forwarding (connections stay open: a partition, not a refusal)."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.delay = 0.0
        self.blackhole = False
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()
        server.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                while self.blackhole:
                    await asyncio.sleep(0.05)
                if self.delay:
                    await asyncio.sleep(self.delay)
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def start(self) -> TcpProxy:
        self._thread.start()
        self._ready.wait(5)
        return self

    async def _shutdown(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"
