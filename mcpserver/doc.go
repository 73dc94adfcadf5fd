// Package mcpserver is the MCP door of loomfs: it serves one Toolbox's
// workspace tools to any MCP client, over stdio or the streamable HTTP
// transport, with the names, descriptions and schemas of tools.Definitions.
//
// It translates and never decides: arguments are checked against the tool's
// own input schema, then handed to the Toolbox, whose refusals become MCP
// tool errors carrying the loomfs error code. The scope is the Toolbox's,
// fixed by whoever built the server; no argument can change it.
package mcpserver
