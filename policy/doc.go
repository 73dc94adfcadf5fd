// Package policy holds every rule loomfs enforces: which paths a model may
// name, which objects may be read or written, the path modes, the
// permission bits anything created or changed gets (OwnerPerm), the limits
// and the error codes with the one errno table. It does no I/O.
//
// Both doors ask the same questions here — the tool handlers and the FUSE
// projection — so a rule exists once. A door translates: its request becomes
// an Op on a cleaned path, the store reports the Object found there, and the
// answer is an *Error whose Code the tool returns and whose Errno the
// filesystem returns.
package policy
