"""The Harness runtime: Skills, tools (built-in and MCP), the prompt pipeline, Hooks, the
bounded agent loop and trajectory records (paper §2.2-2.3). The live-commerce domain it runs
(world, commerce tools, marketing MCP server, rule-based policy, commerce checks) is
`hat_jax.livestream`.

    from hat_jax import harness as hx, livestream
    h = hx.load(livestream.default_world_dir())          # frozen, versioned Harness v0
    world = livestream.load_world(livestream.default_world_dir())
    request = world.make_request(hx.Comment(text="how much is the serum?", viewer_id="v1001"))
    policy = livestream.RuleBasedPolicy(hx.HarnessState(harness=h), world)
    print(hx.run_agent(h, request, policy, livestream.builtin_toolbox(world)).spoken)
"""

from hat_jax.harness._checks import RUNTIME_CHECKS, sentences, to_speech
from hat_jax.harness._deadline import call_with_deadline
from hat_jax.harness._detector import flagged as injection_flagged
from hat_jax.harness._detector import injection_score
from hat_jax.harness._edits import HarnessEdit, apply_edit, load_edit, parse_edit
from hat_jax.harness._errors import PolicyError, ToolDenied, ToolError, ToolTimeout
from hat_jax.harness._frozen import FrozenDict, content_hash, freeze, thaw
from hat_jax.harness._guard import find_all, fold, lexicon_problems, normalize_text
from hat_jax.harness._hook_types import (
    CallSubject,
    CheckLibrary,
    HookContext,
    ReplyCandidate,
    ResultSubject,
    Session,
    Verdict,
)
from hat_jax.harness._libraries import ContextBlocks, LibraryError
from hat_jax.harness._loader import HarnessError, Problem, load
from hat_jax.harness._loop import Limits, run_agent
from hat_jax.harness._manifest import (
    PromotionRefused,
    promote,
    read_manifest,
    reconcile,
    write_manifest,
)
from hat_jax.harness._mcp import (
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
from hat_jax.harness._retrieval import rank_faq, tokens
from hat_jax.harness._spec import (
    FLOW_TOOLS,
    LOAD_SKILL,
    REPLY_PRIVATE,
    REPLY_PUBLIC,
    SKILL_KINDS,
    Constraint,
    Fallback,
    Harness,
    HookRule,
    PromptBlock,
    Rule,
    Skill,
    ToolSpec,
    UserMessageFormat,
)
from hat_jax.harness._state import HarnessState, RenameMap, as_state
from hat_jax.harness._tools import Toolbox
from hat_jax.harness._trajectory import (
    ModelCall,
    Trajectory,
    read_trajectories,
    write_trajectories,
)
from hat_jax.harness._validate import validate_harness as validate

__all__ = [
    "AssistantTurn",
    "CallSubject",
    "CheckLibrary",
    "Comment",
    "Constraint",
    "ContextBlocks",
    "FLOW_TOOLS",
    "Fallback",
    "FrozenDict",
    "Harness",
    "HarnessEdit",
    "HarnessError",
    "HarnessState",
    "HookContext",
    "HookRule",
    "LOAD_SKILL",
    "LibraryError",
    "Limits",
    "McpDiscoveryError",
    "McpToolset",
    "ModelCall",
    "OpenAICompatPolicy",
    "PolicyError",
    "PolicyModel",
    "Problem",
    "PromotionRefused",
    "PromptBlock",
    "REPLY_PRIVATE",
    "REPLY_PUBLIC",
    "RUNTIME_CHECKS",
    "RenameMap",
    "ReplyCandidate",
    "Request",
    "RequestContext",
    "ResultSubject",
    "Rule",
    "SKILL_KINDS",
    "SamplingParams",
    "ScriptedPolicy",
    "Session",
    "Skill",
    "ToolCall",
    "ToolDenied",
    "ToolError",
    "ToolSpec",
    "ToolTimeout",
    "Toolbox",
    "Trajectory",
    "UserMessageFormat",
    "Verdict",
    "apply_edit",
    "as_state",
    "bind_mcp_tools",
    "build_system_prompt",
    "build_user_message",
    "call",
    "call_with_deadline",
    "content_hash",
    "find_all",
    "fold",
    "freeze",
    "group_comments",
    "injection_flagged",
    "injection_score",
    "lexicon_problems",
    "load",
    "load_edit",
    "normalize_text",
    "parse_edit",
    "promote",
    "rank_faq",
    "read_manifest",
    "read_trajectories",
    "reconcile",
    "render_skill",
    "render_text",
    "run_agent",
    "sentences",
    "thaw",
    "to_speech",
    "tokens",
    "tool_schemas",
    "turn_from_message",
    "undeclared_tools",
    "validate",
    "write_manifest",
    "write_trajectories",
]
