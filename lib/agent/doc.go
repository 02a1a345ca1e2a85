// Package agent is the domain of agentloop: threads, messages (AI SDK UIMessages), runs, interrupts, jobs and
// stream segments, the error kinds every layer shares, and the ports (Store, Model, Clock, IDs) that adapters
// implement. It imports only the standard library so that every adapter and handler can depend on it and it on
// nothing: the folder tree reads domain → engine → adapters → functions/cmd.
package agent
