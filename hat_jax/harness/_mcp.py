"""MCP tools for the synchronous loop: discovery at start-up and calls with timeouts.

`McpToolset` owns one `mcp.Client` session on a private event-loop thread, so the agent loop
(and JAX code) stays synchronous. The server may be a URL (streamable HTTP), a
`StdioServerParameters` (a subprocess) or an in-process `MCPServer`. `bind_mcp_tools` checks the
tools a Harness declares for that server against what the server offers (name, parameters,
context arguments) and returns their executors under canonical names.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hat_jax.harness._errors import ToolError, ToolTimeout
from hat_jax.harness._frozen import freeze, thaw
from hat_jax.harness._spec import Harness, ToolSpec
from hat_jax.harness._state import HarnessState, as_state
from hat_jax.harness._tools import Toolbox

if TYPE_CHECKING:
    from mcp import Client

# `mcp` is imported where a connection is made: it takes about a second to import, and most
# processes that import the Harness runtime (training stages, the simulator's sandbox, which
# calls the marketing service in-process) never open an MCP connection.


@dataclasses.dataclass(frozen=True)
class DiscoveredTool:
    """A tool as an MCP server lists it."""

    name: str
    description: str
    input_schema: Mapping[str, Any]


class McpDiscoveryError(RuntimeError):
    """The server does not offer what the Harness declares; `.problems` lists each mismatch."""

    def __init__(self, server: str, problems):
        self.problems = tuple(problems)
        lines = "\n  ".join(self.problems)
        super().__init__(f"MCP server {server!r} does not match the Harness:\n  {lines}")


class McpToolset:
    """A live connection to one MCP server, usable from synchronous code.

    Use as a context manager: `with McpToolset(server) as mcp: mcp.tools, mcp.call(...)`.

    Args:
      server: URL, `StdioServerParameters` or `MCPServer` (anything `mcp.Client` accepts).
      timeout_s: default per-call timeout.
      connect_timeout_s: how long start-up (connect + list tools) may take.
    """

    def __init__(self, server: Any, *, timeout_s: float = 5.0, connect_timeout_s: float = 30.0):
        self.server, self.timeout_s, self.connect_timeout_s = server, timeout_s, connect_timeout_s
        self.tools: tuple[DiscoveredTool, ...] = ()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Client | None = None

    def __enter__(self) -> McpToolset:
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> None:
        """Connects and lists the server's tools (discovery)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="mcp-client"
        )
        self._thread.start()
        ready = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        try:
            self.tools = ready.result(self.connect_timeout_s)
        except BaseException:
            self.close()
            raise

    async def _start(self) -> tuple[DiscoveredTool, ...]:
        ready = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._session = asyncio.ensure_future(self._serve(ready))
        return await ready

    async def _serve(self, ready: asyncio.Future) -> None:
        from mcp import Client

        # The client context must be entered and left by the same task.
        try:
            async with Client(self.server, read_timeout_seconds=self.connect_timeout_s) as client:
                self._client = client
                listed = await client.list_tools()
                ready.set_result(
                    tuple(
                        DiscoveredTool(t.name, t.description or "", freeze(t.input_schema))
                        for t in listed.tools
                    )
                )
                await self._stop.wait()
        except BaseException as err:
            if not ready.done():
                ready.set_exception(err)
            elif not isinstance(err, asyncio.CancelledError):
                raise

    def close(self) -> None:
        """Ends the session (and a stdio subprocess) and stops the loop thread."""
        if self._loop is None:
            return
        loop, self._loop = self._loop, None
        if getattr(self, "_session", None) is not None:
            loop.call_soon_threadsafe(self._stop.set)
            done = asyncio.run_coroutine_threadsafe(
                asyncio.wait([self._session], timeout=10.0), loop
            )
            with contextlib.suppress(Exception):  # best effort on shutdown
                done.result(12.0)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(5.0)
        self._client = None

    def call(self, name: str, arguments: Mapping[str, Any], timeout_s: float | None = None) -> Any:
        """Calls tool `name`; returns its structured result (or parsed JSON / text content).

        Raises:
          ToolError: the server reported an error (message from the server).
          ToolTimeout: the server did not answer within the timeout.
        """
        if self._loop is None or self._client is None:
            raise ToolError("the MCP connection is closed")
        timeout = self.timeout_s if timeout_s is None else timeout_s
        future = asyncio.run_coroutine_threadsafe(
            self._call(name, dict(arguments), timeout), self._loop
        )
        try:
            return future.result(timeout + 1.0)
        except TimeoutError as err:
            future.cancel()
            raise ToolTimeout(f"{name} did not answer within {timeout:.1f} s") from err

    async def _call(self, name: str, arguments: dict[str, Any], timeout: float) -> Any:
        from mcp import MCPError
        from mcp_types.jsonrpc import REQUEST_TIMEOUT

        try:
            result = await self._client.call_tool(name, arguments, read_timeout_seconds=timeout)
        except MCPError as err:
            if err.code == REQUEST_TIMEOUT:
                raise ToolTimeout(f"{name} did not answer within {timeout:.1f} s") from err
            raise ToolError(f"{name} failed: {err}") from err
        text = "\n".join(c.text for c in result.content if getattr(c, "text", None) is not None)
        if result.is_error:
            # MCPServer prefixes anticipated errors with this; the policy needs only the reason.
            raise ToolError(text.removeprefix(f"Error executing tool {name}: ") or f"{name} failed")
        if result.structured_content is not None:
            return result.structured_content
        try:
            return json.loads(text)
        except ValueError:
            return text

    def executors(self, names) -> Toolbox:
        """Executors calling the given server tools (the loop applies its own timeout too)."""
        return Toolbox({n: (lambda args, n=n: self.call(n, args)) for n in names})


def _types(schema: Mapping[str, Any]) -> set[str]:
    if "type" in schema:
        t = schema["type"]
        return {t} if isinstance(t, str) else set(t)
    return {x for alt in schema.get("anyOf", ()) for x in _types(alt)}


def _compatibility(spec: ToolSpec, canonical: str, offered: DiscoveredTool) -> list[str]:
    mine, theirs = thaw(spec.parameters), thaw(offered.input_schema)
    props, server_props = mine.get("properties", {}), theirs.get("properties", {})
    out = []
    for name, schema in props.items():
        if name not in server_props:
            out.append(f"{canonical}: parameter {name!r} is not accepted by the server")
        elif (
            _types(schema)
            and _types(server_props[name])
            and not _types(schema) <= _types(server_props[name])
        ):
            out.append(
                f"{canonical}: parameter {name!r} has type {sorted(_types(schema))} but the server takes {sorted(_types(server_props[name]))}"
            )
    out += [
        f"{canonical}: context argument {a!r} is not accepted by the server"
        for a in spec.context_args
        if a not in server_props
    ]
    missing = (
        set(theirs.get("required", ())) - set(mine.get("required", ())) - set(spec.context_args)
    )
    out += [
        f"{canonical}: the server requires {m!r}, which the Harness neither requires nor injects"
        for m in sorted(missing)
    ]
    return out


def bind_mcp_tools(
    harness: Harness | HarnessState, server_name: str, toolset: McpToolset
) -> Toolbox:
    """Checks the Harness's tools of provider `mcp:<server_name>` against the server.

    Returns:
      Executors by canonical name for every declared tool.

    Raises:
      McpDiscoveryError: a declared tool is missing or its parameters disagree with the server.
    """
    state = as_state(harness)
    offered = {t.name: t for t in toolset.tools}
    problems, names = [], []
    for spec in state.harness.tools:
        if spec.provider != f"mcp:{server_name}":
            continue
        canonical = state.renames.canonical_tool(spec.name)
        if canonical not in offered:
            problems.append(f"{canonical}: not offered by the server (it offers {sorted(offered)})")
            continue
        problems += _compatibility(spec, canonical, offered[canonical])
        names.append(canonical)
    if problems:
        raise McpDiscoveryError(server_name, problems)
    return toolset.executors(names)


def undeclared_tools(harness: Harness | HarnessState, toolset: McpToolset) -> list[str]:
    """Server tools the Harness does not declare (not exposed to the policy until it does)."""
    state = as_state(harness)
    return sorted(set(t.name for t in toolset.tools) - set(state.canonical_tools))
