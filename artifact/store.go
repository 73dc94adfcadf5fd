// Package artifact keeps copies of what loomfs must not lose with its
// volume in an S3-compatible object store: a finished run's published
// files (content-addressed blobs and a manifest) and audit anchors in a
// write-once (Object Lock) bucket.
//
// A snapshot lives on the same storage as the data it protects; a
// published run does not. The store's credentials come from the AWS SDK's
// standard chain (environment, shared files, instance roles), never from
// the policy file, and never appear in an answer or a log.
package artifact

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// Config says where the store is. Credentials are not part of it.
type Config struct {
	// Endpoint is the S3 service's URL; empty means AWS itself.
	Endpoint string
	// Bucket holds published runs.
	Bucket string
	// AnchorBucket, created with Object Lock enabled, holds audit anchors.
	AnchorBucket string
	// Prefix is put before every key the store writes ("" or "team/").
	Prefix string
	// PathStyle addresses buckets as ENDPOINT/BUCKET rather than
	// BUCKET.ENDPOINT, as most self-hosted services (Ceph RGW, MinIO) need.
	PathStyle bool
	// Region defaults to the SDK's (AWS_REGION), else us-east-1.
	Region string
}

// ConfigFromEnv reads AGENT_LOOM_S3_ENDPOINT, AGENT_LOOM_S3_BUCKET,
// AGENT_LOOM_S3_ANCHOR_BUCKET, AGENT_LOOM_S3_PREFIX and
// AGENT_LOOM_S3_PATH_STYLE. It fails on a malformed value, not on a
// missing bucket: each use checks the bucket it needs.
func ConfigFromEnv() (Config, error) {
	c := Config{
		Endpoint:     os.Getenv("AGENT_LOOM_S3_ENDPOINT"),
		Bucket:       os.Getenv("AGENT_LOOM_S3_BUCKET"),
		AnchorBucket: os.Getenv("AGENT_LOOM_S3_ANCHOR_BUCKET"),
		Prefix:       os.Getenv("AGENT_LOOM_S3_PREFIX"),
	}
	if v := os.Getenv("AGENT_LOOM_S3_PATH_STYLE"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return c, fmt.Errorf("AGENT_LOOM_S3_PATH_STYLE=%q: want true or false", v)
		}
		c.PathStyle = b
	}
	if c.Prefix != "" && !strings.HasSuffix(c.Prefix, "/") {
		c.Prefix += "/"
	}
	return c, nil
}

// Store is a connection to the object store.
type Store struct {
	s3  *s3.Client
	cfg Config
}

// Open makes a client for cfg with the SDK's standard credential chain. It
// does not contact the service.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	opts := []func(*config.LoadOptions) error{}
	if cfg.Region != "" {
		opts = append(opts, config.WithRegion(cfg.Region))
	}
	ac, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("artifact store: load the SDK's configuration: %w", err)
	}
	if ac.Region == "" {
		ac.Region = "us-east-1"
	}
	client := s3.NewFromConfig(ac, func(o *s3.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		o.UsePathStyle = cfg.PathStyle
		// Newer SDKs send CRC checksums in trailers by default, which
		// older S3 services (Ceph RGW before 18) refuse. Integrity is
		// kept by Content-MD5 on every put and sha256 on every read.
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	return &Store{s3: client, cfg: cfg}, nil
}

// Config returns the store's configuration.
func (s *Store) Config() Config { return s.cfg }

func (s *Store) bucket() (string, error) {
	if s.cfg.Bucket == "" {
		return "", errors.New("artifact store: no bucket configured (AGENT_LOOM_S3_BUCKET)")
	}
	return s.cfg.Bucket, nil
}

func (s *Store) blobKey(sha string) string { return s.cfg.Prefix + "blobs/" + sha[:2] + "/" + sha }
func (s *Store) manifestKey(run string) string {
	return s.cfg.Prefix + "runs/" + run + "/manifest.json"
}

// isNotFound reports whether err is the service's "no such object".
func isNotFound(err error) bool {
	var nf *types.NotFound
	var nk *types.NoSuchKey
	if errors.As(err, &nf) || errors.As(err, &nk) {
		return true
	}
	var re *smithyhttp.ResponseError
	return errors.As(err, &re) && re.HTTPStatusCode() == 404
}

// storeErr wraps a service error with what was being done. The SDK's
// errors name the operation, bucket and key, never the credentials.
func storeErr(what string, err error) error {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return fmt.Errorf("artifact store: %s: %s: %s", what, ae.ErrorCode(), ae.ErrorMessage())
	}
	return fmt.Errorf("artifact store: %s: %w", what, err)
}

// ParseURL splits s3://BUCKET[/PREFIX] into the bucket and a key prefix
// ("" or ending in "/"). The endpoint is not part of it: it comes from the
// configuration, as the credentials come from the SDK's chain.
func ParseURL(raw string) (bucket, prefix string, err error) {
	rest, ok := strings.CutPrefix(raw, "s3://")
	if !ok {
		return "", "", fmt.Errorf("%q: want s3://BUCKET[/PREFIX]", raw)
	}
	bucket, prefix, _ = strings.Cut(rest, "/")
	if !validBucket(bucket) {
		return "", "", fmt.Errorf("%q: bucket %q is not a valid S3 bucket name (3 to 63 lowercase letters, digits, dots and hyphens)", raw, bucket)
	}
	prefix = strings.TrimSuffix(prefix, "/")
	if prefix == "" {
		return bucket, "", nil
	}
	for _, part := range strings.Split(prefix, "/") {
		if part == "" || part == "." || part == ".." {
			return "", "", fmt.Errorf("%q: the prefix may not hold empty, \".\" or \"..\" parts", raw)
		}
	}
	return bucket, prefix + "/", nil
}

func validBucket(b string) bool {
	if len(b) < 3 || len(b) > 63 {
		return false
	}
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case (c == '-' || c == '.') && i > 0 && i < len(b)-1:
		default:
			return false
		}
	}
	return true
}
