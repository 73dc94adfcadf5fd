package tools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// Two-step confirmation (seed 001 §6.3). Where the policy marks an
// operation (deleting or overwriting in output/, in the standard policy),
// the first call changes nothing and answers confirmation_required with a
// one-time token bound to the tool, the path, the call's other arguments
// and the file's current sha256. The same call with confirm_token does it.
// The token is consumed when presented, so it works once; presented with
// another path, other arguments or after the file changed, it is refused
// and a fresh one is given for the call as it now stands.

// confirmTokenField is the input field that carries a token.
const confirmTokenField = "confirm_token"

// confirm decides whether a call of tool that makes op at rel may go
// ahead. When it may, expected is the sha256 the file had when the token
// was given ("" for none needed or a directory): the caller makes the
// change only if the file still has it, so the file confirmed is the file
// changed.
func (t *Toolbox) confirm(ctx context.Context, tool string, op policy.Op, rel string, input json.RawMessage, token string) (expected *string, err error) {
	sub, ok := t.WS.Policy().NeedsConfirm(op, rel)
	if !ok {
		return nil, nil
	}
	info, err := t.WS.Lstat(rel)
	if policy.CodeOf(err) == policy.NotFound {
		return nil, nil // creating is never confirmed; a delete answers not_found
	}
	if err != nil {
		return nil, err
	}
	// A directory or an emulated link is deleted as a name: the token
	// binds no content (a link is never read as a file).
	asName := info.Kind == policy.KindDir || info.Kind == policy.KindLink
	if info.Kind != policy.KindRegular && !(op == policy.OpDelete && asName) {
		return nil, nil // the store refuses it with the right code
	}
	var fileSHA string
	if info.Kind != policy.KindLink {
		if fileSHA, _, err = t.WS.ContentHash(rel); err != nil {
			return nil, err
		}
	}
	argsSHA, err := argsHash(input)
	if err != nil {
		return nil, err
	}
	why := ""
	if token != "" {
		rec, err := t.WS.RedeemToken(token)
		if err != nil {
			return nil, err
		}
		switch {
		case rec == nil:
			why = "confirm_token is unknown or was already used (a token works once)"
		case time.Now().After(rec.Expires):
			why = "confirm_token has expired"
		case rec.Tool != tool || rec.Path != rel:
			why = fmt.Sprintf("confirm_token was given for %s of %s, not for %s of %s", rec.Tool, rec.Path, tool, rel)
		case rec.ArgsSHA != argsSHA:
			why = "confirm_token was given for the same path with other arguments"
		case rec.FileSHA != fileSHA:
			why = fmt.Sprintf("%s changed since the confirm_token was given", rel)
		default:
			if asName {
				return nil, nil
			}
			return &fileSHA, nil
		}
	}
	now := time.Now().UTC()
	tok, err := t.WS.IssueToken(store.Confirmation{Tool: tool, Path: rel, ArgsSHA: argsSHA, FileSHA: fileSHA, Issued: now, Expires: now.Add(policy.ConfirmTTL)})
	if err != nil {
		return nil, err
	}
	return nil, policy.ConfirmationNeeded(op, rel, sub, tok, why)
}

// argsHash hashes a call's arguments in a canonical form (keys sorted,
// values re-encoded) with confirm_token left out, so the confirming call
// matches the first whatever its formatting.
func argsHash(input json.RawMessage) (string, error) {
	var m map[string]any
	if err := json.Unmarshal(input, &m); err != nil {
		return "", policy.Errorf(policy.InvalidInput, "input is not a JSON object: %v", err)
	}
	delete(m, confirmTokenField)
	b, err := json.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("encode arguments: %w", err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:]), nil
}

// confirmProp is the schema of confirm_token.
var confirmProp = prop{"type": "string", "description": "Only when a previous identical call answered confirmation_required: the confirm_token it gave, to go ahead."}

// withConfirm adds confirm_token to a schema's properties when the policy
// marks op anywhere.
func withConfirm(pol *policy.Policy, op policy.Op, props map[string]prop) map[string]prop {
	for _, s := range pol.Subtrees {
		for _, c := range s.Confirm {
			if c == op {
				props[confirmTokenField] = confirmProp
				return props
			}
		}
	}
	return props
}
