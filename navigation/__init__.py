"""Tree and graph exploration under hard budgets: a pure algorithm package that knows nothing of SQL,
HTTP or agentdb (the navigation issues fill it; agentdb hands it SQL-backed readers)."""
