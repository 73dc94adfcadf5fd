package artifact

import (
	"slices"
	"testing"

	"github.com/agentloom/loomfs/policy"
)

func TestConfigFromEnv(t *testing.T) {
	cases := []struct {
		name, pathStyle, prefix string
		wantStyle               bool
		wantPrefix              string
		fails                   bool
	}{
		{"defaults", "", "", false, "", false},
		{"path style on", "true", "", true, "", false},
		{"path style off", "0", "", false, "", false},
		{"a prefix gets its slash", "", "team", false, "team/", false},
		{"a prefix keeps its slash", "", "team/", false, "team/", false},
		{"a malformed path style", "sometimes", "", false, "", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("AGENT_LOOM_S3_PATH_STYLE", c.pathStyle)
			t.Setenv("AGENT_LOOM_S3_PREFIX", c.prefix)
			cfg, err := ConfigFromEnv()
			if (err != nil) != c.fails {
				t.Fatalf("err = %v, want failure %v", err, c.fails)
			}
			if err == nil && (cfg.PathStyle != c.wantStyle || cfg.Prefix != c.wantPrefix) {
				t.Fatalf("got %+v", cfg)
			}
		})
	}
}

func TestPublishedPaths(t *testing.T) {
	cases := []struct {
		name  string
		paths []string
		in    []string
		out   []string
		code  policy.Code
	}{
		{"output by default", nil, []string{"output/a", "output/d/b"}, []string{"outputs/a", "output.txt", "a/output/b"}, ""},
		{"everything", []string{"."}, []string{"a", "output/b", ".meta/c"}, nil, ""},
		{"two subtrees", []string{"dist/", "./report"}, []string{"dist/x", "report/y", "report"}, []string{"output/a", "reports/z"}, ""},
		{"an escaping path is refused", []string{"../other"}, nil, nil, policy.InvalidPath},
		{"an absolute path is refused", []string{"/etc"}, nil, nil, policy.InvalidPath},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dirs, err := cleanPaths(c.paths)
			if c.code != "" {
				if policy.CodeOf(err) != c.code {
					t.Fatalf("cleanPaths(%q) = %v, want %s", c.paths, err, c.code)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range c.in {
				if !under(p, dirs) {
					t.Errorf("%s not published under %v", p, dirs)
				}
			}
			for _, p := range c.out {
				if under(p, dirs) {
					t.Errorf("%s published under %v", p, dirs)
				}
			}
			if !slices.IsSorted(dirs) {
				t.Errorf("paths %v not sorted", dirs)
			}
		})
	}
}

func TestParseURL(t *testing.T) {
	cases := []struct {
		url, bucket, prefix string
		fails               bool
	}{
		{"s3://loomfs-anchors", "loomfs-anchors", "", false},
		{"s3://loomfs-anchors/", "loomfs-anchors", "", false},
		{"s3://loomfs-anchors/team/a", "loomfs-anchors", "team/a/", false},
		{"s3://loomfs-anchors/team/a/", "loomfs-anchors", "team/a/", false},
		{"s3://b.example.org/x", "b.example.org", "x/", false},
		{"loomfs-anchors/x", "", "", true},
		{"https://loomfs-anchors/x", "", "", true},
		{"s3://", "", "", true},
		{"s3://ab", "", "", true},
		{"s3://Upper/x", "", "", true},
		{"s3://-lead/x", "", "", true},
		{"s3://b_under/x", "", "", true},
		{"s3://bucket/a//b", "", "", true},
		{"s3://bucket/a/../b", "", "", true},
		{"s3://bucket/./b", "", "", true},
	}
	for _, c := range cases {
		t.Run(c.url, func(t *testing.T) {
			b, p, err := ParseURL(c.url)
			if (err != nil) != c.fails {
				t.Fatalf("ParseURL(%q) = %q, %q, %v; want failure %v", c.url, b, p, err, c.fails)
			}
			if err == nil && (b != c.bucket || p != c.prefix) {
				t.Fatalf("ParseURL(%q) = %q, %q; want %q, %q", c.url, b, p, c.bucket, c.prefix)
			}
		})
	}
}
