-- Every write that adds or removes a term's postings updates the term's agentdb.term_stats row (a bulk load:
-- nearly every term, every batch). With free room in each page the new version goes beside the old (a HOT
-- update, no index entry) and the next update prunes the dead one, so the table stays near twice its rows
-- instead of holding a version per batch until a VACUUM; its rows are read one by one through the primary key.
-- New pages only: an existing table keeps its pages as they are.
alter table agentdb.term_stats set (fillfactor = 50);
