"""Tree and graph exploration under hard budgets: a pure algorithm package that knows nothing of SQL, HTTP or
agentdb. The caller supplies scoped reads, child and neighbour lists, scores and a model through the small
protocols in `navigation.protocols`; the package supplies the frontier, the walks, ranked selection, the
agentic loop policy and the budgets they share."""

from navigation.agentic import TOOL_NAMES, Lookup, run_agentic, system_prompt, tool_definitions
from navigation.budget import TOOL_CALL_CAP, Budget, TokenEstimator, estimate_tokens, fit_prefix
from navigation.frontier import Frontier
from navigation.graph import GraphWalk, graph_candidates
from navigation.nodes import (
    CallRecord,
    Candidate,
    Direction,
    NavigationResult,
    Node,
    Reason,
    Status,
    Step,
    StepKind,
    Visit,
)
from navigation.protocols import (
    ChildLister,
    Chooser,
    Decision,
    NeighbourLister,
    NodeReader,
    ProgressCallback,
    Remaining,
    Scorer,
    Searcher,
    ToolCall,
    ToolResult,
    Turn,
)
from navigation.render import (
    neutralise,
    render_candidate,
    render_document,
    render_rules,
    snippet,
)
from navigation.scoring import (
    DEFAULT_COMBINE,
    ContextScorer,
    ScoreCombiner,
    decayed_sum,
    document_key,
)
from navigation.tree import TreeWalk, answer_order, rank_tree
from navigation.walk import Walk

__all__ = [
    "DEFAULT_COMBINE",
    "TOOL_CALL_CAP",
    "TOOL_NAMES",
    "Budget",
    "CallRecord",
    "Candidate",
    "ChildLister",
    "Chooser",
    "ContextScorer",
    "Decision",
    "Direction",
    "Frontier",
    "GraphWalk",
    "Lookup",
    "NavigationResult",
    "NeighbourLister",
    "Node",
    "NodeReader",
    "ProgressCallback",
    "Reason",
    "Remaining",
    "ScoreCombiner",
    "Scorer",
    "Searcher",
    "Status",
    "Step",
    "StepKind",
    "TokenEstimator",
    "ToolCall",
    "ToolResult",
    "TreeWalk",
    "Turn",
    "Visit",
    "Walk",
    "answer_order",
    "decayed_sum",
    "document_key",
    "estimate_tokens",
    "fit_prefix",
    "graph_candidates",
    "neutralise",
    "rank_tree",
    "render_candidate",
    "render_document",
    "render_rules",
    "run_agentic",
    "snippet",
    "system_prompt",
    "tool_definitions",
]
