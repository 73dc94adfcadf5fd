// Package quota keeps one scope's quota account across every process and
// node that changes the scope, so that the bytes and files they admit
// together never exceed the scope's limits. It decides nothing about
// paths or objects (that is policy's) and reaches no file of the scope:
// it lives in a directory of the scope's state directory, outside every
// projection, and is handed a walk of the scope when it must count. A
// capped subtree of the scope (tmp/) keeps an account of the same kind,
// in a directory of its own, with the cap as its limits, a walk of the
// subtree and Options.Check to word its refusals.
//
// # Grants
//
// The account is a ledger file, changed only under an open file
// description lock on it, and one record file per holder (an open
// Account). The lock is asked for without blocking, again and again until
// the caller's context ends (package ofdlock): a node that died holding it
// on CephFS keeps it until the metadata server gives up on the node, and
// a write that needs a grant meanwhile answers timeout at its budget. A holder takes a grant from the ledger (bytes and files it
// may add without asking again), spends it locally with no system call,
// and takes another when it runs out, as Lustre's quota slaves take
// grants from the quota master. A grant is sized to a fraction of what is
// free, so near the limit grants shrink and the last bytes go to whoever
// asks for them; an idle holder (no change for Options.Idle) folds what it
// spent into the ledger and returns what is left of its grant. A change
// that fits only once another holder's unspent grant comes back waits for
// it, up to twice Options.Idle and never past its context's end, rather
// than being refused.
//
// A holder keeps its record locked (an OFD lock) for as long as it is
// open, and writes into it, through a shared mapping, what it has spent
// and what it still holds. Whoever takes the ledger lock and finds a
// record whose lock is free knows its holder is gone: it folds the spent
// bytes into the ledger and drops the record, and with it the grant. On
// one node the mapping survives the holder's death in the page cache, so
// nothing is lost. A record read from another node is as of the holder's
// last grant, so its whole grant is counted as spent and the scope counted
// again: at once if no other node's holder is active, or else the ledger
// is marked unsure and the first holder to fold (or reconcile) with no
// other node's holder active counts it, so a dead node's grant does not
// keep the scope short of room.
//
// The mapping must never cost the process: a store into a page with no
// block behind it (a full volume) or one the filesystem can't read back
// (an I/O error, a file truncated under it) is a SIGBUS. So a record is
// written and its blocks allocated before it is mapped (a full volume
// refuses the holder's Open with ENOSPC), and every store into the mapping
// turns a fault into an error and falls back to writing the record.
//
// A refusal names the limit and the figures as seen across all holders:
// "used" is what the ledger and every holder have spent plus what the
// other holders still hold as grants.
//
// # Reconcile
//
// Account.Reconcile walks the scope under the ledger lock and, when every
// holder has gone idle and settled and two walks agree, corrects the
// ledger to what the walks found, logging the correction and its size: a
// change is counted before its system call ends, so a scope still
// changing is never corrected. Recount, for a change the account did not
// see, needs only that no holder on another node is active (this node's
// are read live). Inspect reads the account without joining or changing
// it (loomfs check), under a shared lock of the ledger: a holder folds its
// spending into the ledger and clears its record under the exclusive one,
// and a read between the two would count that share twice or not at all.
package quota
