"""Exceptions shared by tool executors, the MCP bridge and policies."""


class ToolError(Exception):
    """An anticipated tool failure (unknown order, no active campaign, ...).

    The loop returns its message to the policy as an error result; it is not a crash.
    """

    kind = "tool_error"


class ToolDenied(ToolError):
    """The service refused the operation (permission or eligibility)."""

    kind = "denied"


class PolicyError(RuntimeError):
    """The policy could not produce a turn (HTTP failure, exhausted script, bad response)."""


class ToolTimeout(ToolError):
    """A remote tool (e.g. over MCP) reported that it timed out."""

    kind = "timeout"
