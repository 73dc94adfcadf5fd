package artifact

import (
	"context"
	"crypto/md5"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/agentloom/loomfs/audit"
)

// Audit anchors go to a bucket created with Object Lock, each written in
// compliance mode with a retention: until it ends, no one (not the
// volume's administrator, not the bucket's owner) can delete or replace
// that version. A later write of the same key is a new version and a
// delete only lays a marker, so Anchors reads every version.

// maxAnchorBytes bounds one anchor read.
const maxAnchorBytes = 1 << 20

func (s *Store) anchorBucket() (string, error) {
	if s.cfg.AnchorBucket == "" {
		return "", errors.New("artifact store: no anchor bucket configured (AGENT_LOOM_S3_ANCHOR_BUCKET)")
	}
	return s.cfg.AnchorBucket, nil
}

// PutAnchor writes a under a new key, locked in compliance mode for
// retain, and returns the key.
func (s *Store) PutAnchor(ctx context.Context, a audit.Anchor, retain time.Duration) (string, error) {
	bucket, err := s.anchorBucket()
	if err != nil {
		return "", err
	}
	if retain <= 0 {
		return "", fmt.Errorf("artifact store: an anchor needs a retention (got %s)", retain)
	}
	body, err := json.Marshal(a)
	if err != nil {
		return "", err
	}
	body = append(body, '\n')
	now := time.Now().UTC()
	key := s.cfg.Prefix + "anchors/" + now.Format("20060102T150405.000000000Z") + ".json"
	md := md5.Sum(body)
	_, err = s.s3.PutObject(ctx, &s3.PutObjectInput{
		Bucket: &bucket, Key: &key, Body: strings.NewReader(string(body)),
		ContentLength:             aws.Int64(int64(len(body))),
		ContentMD5:                aws.String(base64.StdEncoding.EncodeToString(md[:])),
		ContentType:               aws.String("application/json"),
		ObjectLockMode:            types.ObjectLockModeCompliance,
		ObjectLockRetainUntilDate: aws.Time(now.Add(retain)),
	})
	if err != nil {
		return "", storeErr("write the anchor "+key, err)
	}
	return key, nil
}

// AnchorVersion is one stored anchor.
type AnchorVersion struct {
	Key       string       `json:"key"`
	VersionID string       `json:"version_id"`
	Anchor    audit.Anchor `json:"anchor"`
}

// Anchors reads the newest n anchors (every version of every anchor key,
// newest anchor first); n <= 0 reads them all. An anchor that doesn't
// parse is an error naming it.
func (s *Store) Anchors(ctx context.Context, n int) ([]AnchorVersion, error) {
	bucket, err := s.anchorBucket()
	if err != nil {
		return nil, err
	}
	prefix := s.cfg.Prefix + "anchors/"
	var vers []types.ObjectVersion
	p := s3.NewListObjectVersionsPaginator(s.s3, &s3.ListObjectVersionsInput{Bucket: &bucket, Prefix: &prefix})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, storeErr("list anchors", err)
		}
		vers = append(vers, page.Versions...)
	}
	// Keys are timestamps: newest last by key, then by version time.
	slices.SortFunc(vers, func(a, b types.ObjectVersion) int {
		if c := strings.Compare(aws.ToString(b.Key), aws.ToString(a.Key)); c != 0 {
			return c
		}
		return aws.ToTime(b.LastModified).Compare(aws.ToTime(a.LastModified))
	})
	if n > 0 && len(vers) > n {
		vers = vers[:n]
	}
	var out []AnchorVersion
	for _, v := range vers {
		out1, err := s.s3.GetObject(ctx, &s3.GetObjectInput{Bucket: &bucket, Key: v.Key, VersionId: v.VersionId})
		if err != nil {
			return nil, storeErr("read anchor "+aws.ToString(v.Key), err)
		}
		body, err := io.ReadAll(io.LimitReader(out1.Body, maxAnchorBytes))
		out1.Body.Close()
		if err != nil {
			return nil, storeErr("read anchor "+aws.ToString(v.Key), err)
		}
		as, err := audit.ReadAnchors(strings.NewReader(string(body)))
		if err != nil || len(as) != 1 {
			return nil, fmt.Errorf("%w: anchor %s (version %s) is not one anchor: %v", ErrDamaged, aws.ToString(v.Key), aws.ToString(v.VersionId), err)
		}
		out = append(out, AnchorVersion{Key: aws.ToString(v.Key), VersionID: aws.ToString(v.VersionId), Anchor: as[0]})
	}
	return out, nil
}
