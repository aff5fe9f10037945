"""The Harness runtime: Skills, tools (built-in and MCP), the prompt pipeline, Hooks, the
bounded agent loop and trajectory records (paper §2.2-2.3).

Typical use:

    from hat_jax import harness as hx
    h = hx.load("data/livestream")                 # frozen, versioned Harness v0
    world = hx.load_world("data/livestream")       # catalog, room, orders, marketing
    tools = hx.builtin_toolbox(world)
    with hx.McpToolset(hx.marketing_server(world)) as mcp:     # discovery at start-up
        tools = tools.merged(hx.bind_mcp_tools(h, "marketing", mcp))
        request = world.make_request(hx.Comment(text="how much is the serum?", viewer_id="v1001"))
        traj = hx.run_agent(h, request, hx.RuleBasedPolicy(hx.HarnessState(harness=h), world), tools)
    print(traj.spoken)

For Harness-State Augmentation: derive variants with `dataclasses.replace` or
`HarnessState.rename_tool` / `rename_skill` (which keep every reference consistent and extend the
`RenameMap`), then `validate(variant.harness, variant.renames)`. Executors stay keyed by
canonical names; `HarnessState.resolve_tool` is the single place surface names are resolved.
"""

import pathlib

from hat_jax.harness._checks import normalize_text, to_speech
from hat_jax.harness._deadline import DeadlineExceeded, call_with_deadline
from hat_jax.harness._errors import PolicyError, ToolDenied, ToolError, ToolTimeout
from hat_jax.harness._factcheck import Evidence, unsupported_claims
from hat_jax.harness._frozen import FrozenDict, content_hash, freeze, thaw
from hat_jax.harness._hooks import HOOK_IMPLEMENTATIONS, HookRunner, ReplyCandidate
from hat_jax.harness._loader import HarnessError, Problem, load
from hat_jax.harness._loop import Limits, run_agent
from hat_jax.harness._manifest import (
    Mismatch,
    PromotionRefused,
    promote,
    read_manifest,
    reconcile,
    write_manifest,
)
from hat_jax.harness._marketing import MarketingService, marketing_server, marketing_server_params
from hat_jax.harness._mcp import (
    DiscoveredTool,
    McpDiscoveryError,
    McpToolset,
    bind_mcp_tools,
    undeclared_tools,
)
from hat_jax.harness._openai import OpenAICompatPolicy, turn_from_message
from hat_jax.harness._policy import (
    AssistantTurn,
    PolicyModel,
    SamplingParams,
    ScriptedPolicy,
    ToolCall,
    call,
)
from hat_jax.harness._prompt import (
    build_system_prompt,
    build_user_message,
    render_skill,
    render_text,
    tool_schemas,
)
from hat_jax.harness._request import Comment, Request, RequestContext, group_comments
from hat_jax.harness._rule_policy import RuleBasedPolicy
from hat_jax.harness._spec import (
    CONTEXT_ARGS,
    FLOW_TOOLS,
    HOOK_POINTS,
    SKILL_KINDS,
    TOOL_CATEGORIES,
    Constraint,
    Fallback,
    Harness,
    HookRule,
    HookSpec,
    ModuleEntry,
    PromptBlock,
    PromptSpec,
    Rule,
    Skill,
    ToolSpec,
    UserMessageFormat,
)
from hat_jax.harness._state import HarnessState, RenameMap, as_state
from hat_jax.harness._tools import Toolbox, builtin_toolbox
from hat_jax.harness._trajectory import (
    Fault,
    FinalReply,
    HookEvent,
    ModelCall,
    ToolRecord,
    Trajectory,
    read_trajectories,
    write_trajectories,
)
from hat_jax.harness._validate import validate_harness as validate
from hat_jax.harness._world import World, WorldError, load_world


def default_world_dir() -> pathlib.Path:
    """The bundled world (`data/livestream/`, with Harness v0 in its `harness/` folder)."""
    return pathlib.Path(__file__).resolve().parents[2] / "data" / "livestream"


__all__ = [
    "CONTEXT_ARGS",
    "FLOW_TOOLS",
    "HOOK_IMPLEMENTATIONS",
    "HOOK_POINTS",
    "SKILL_KINDS",
    "TOOL_CATEGORIES",
    "AssistantTurn",
    "Comment",
    "Constraint",
    "DeadlineExceeded",
    "DiscoveredTool",
    "Evidence",
    "Fallback",
    "Fault",
    "FinalReply",
    "FrozenDict",
    "Harness",
    "HarnessError",
    "HarnessState",
    "HookEvent",
    "HookRule",
    "HookRunner",
    "HookSpec",
    "Limits",
    "MarketingService",
    "McpDiscoveryError",
    "McpToolset",
    "Mismatch",
    "ModelCall",
    "ModuleEntry",
    "OpenAICompatPolicy",
    "PolicyError",
    "PolicyModel",
    "Problem",
    "PromotionRefused",
    "PromptBlock",
    "PromptSpec",
    "RenameMap",
    "ReplyCandidate",
    "Request",
    "RequestContext",
    "Rule",
    "RuleBasedPolicy",
    "SamplingParams",
    "ScriptedPolicy",
    "Skill",
    "ToolCall",
    "ToolDenied",
    "ToolError",
    "ToolRecord",
    "ToolSpec",
    "ToolTimeout",
    "Toolbox",
    "Trajectory",
    "UserMessageFormat",
    "World",
    "WorldError",
    "as_state",
    "bind_mcp_tools",
    "call_with_deadline",
    "build_system_prompt",
    "build_user_message",
    "builtin_toolbox",
    "call",
    "content_hash",
    "default_world_dir",
    "freeze",
    "group_comments",
    "load",
    "load_world",
    "marketing_server",
    "marketing_server_params",
    "normalize_text",
    "promote",
    "read_manifest",
    "read_trajectories",
    "reconcile",
    "render_skill",
    "render_text",
    "run_agent",
    "tool_schemas",
    "thaw",
    "to_speech",
    "turn_from_message",
    "undeclared_tools",
    "unsupported_claims",
    "validate",
    "write_manifest",
    "write_trajectories",
]
