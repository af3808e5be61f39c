-- Which version of the grants in sql/050_principals.sql each principal's role holds (0: installed before
-- versions were recorded). That file re-installs every principal below its current version each time
-- migrate re-applies it, which converts existing principals to new grants in place (role, name and key stay).
alter table agentdb.principals add column install_version int not null default 0;
