"""agentdb as a Model Context Protocol server: assistants in MCP clients use its search, navigation and memory
as tools, under their API key's permissions and a budget per session.

  * `tools`: the tools, each a thin door onto what HTTP calls, with their input models
  * `budget`: what one session may spend (tool calls, nodes read, bytes returned)
  * `server`: the SDK's low-level server: listing, checking and running calls, errors as tool errors
  * `stdio`: `agentdb mcp` (stdio; AGENTDB_API_KEY names the principal)
  * `http`: streamable HTTP at /mcp of `agentdb serve`, admitted as every API request is

Nothing is imported here: agentdb.api imports `http` where it builds the app, and `http` imports agentdb.api's
admission rules.
"""
