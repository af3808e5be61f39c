-- agentdb.auth offers the `ingest` tool (document writes over HTTP), which the tools check left out.
alter table agentdb.principals drop constraint principals_tools_check;
alter table agentdb.principals add constraint principals_tools_check
    check (tools <@ array['search', 'tree_search', 'graph_search', 'memory', 'ingest']);
