package policy

// Commands is the policy file's "commands" setting: where workspace_command
// runs each command.
type Commands string

const (
	// CommandsFresh (the default when empty) runs each command in a fresh
	// container that is removed before the call returns (SPEC §5).
	CommandsFresh Commands = "fresh"
	// CommandsSession runs each command as an exec in the scope's session
	// sandbox (SPEC §5.1), the container the process tools use: same
	// hardening and mounts, no container start per command. What a command
	// leaves in /tmp stays for the session's later commands, and a command
	// sees the session's processes; what it leaves running is killed when
	// its main process exits, as in a fresh container.
	CommandsSession Commands = "session"
)

// SessionCommands reports whether workspace_command runs in the session
// sandbox, as "commands: session" says.
func (p *Policy) SessionCommands() bool { return p.Commands == CommandsSession }
