-- A registered table's title column (`agentdb register --title-column`): its hits carry that column as their
-- title, as a document table's carry `title`. Null: the table has none, and its hits' title is ''.
alter table agentdb.sources add column title_column text;
