package tools

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"hash/crc32"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentloom/loomfs/policy"
)

func testImage(w, h int) image.Image {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			img.Set(x, y, color.RGBA{uint8(x), uint8(y), uint8(x ^ y), 255})
		}
	}
	return img
}

func writePNG(t *testing.T, path string, w, h int) {
	t.Helper()
	var b bytes.Buffer
	if err := png.Encode(&b, testImage(w, h)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}

// webpLossless is a 1×1 lossless WebP (from the format's examples).
var webpLossless, _ = base64.StdEncoding.DecodeString("UklGRhoAAABXRUJQVlA4TA0AAAAvAAAAEAcQERGIiP4HAA==")

// bombPNG is a valid PNG header claiming width×height pixels, with one
// tiny IDAT: a decompression bomb's outline.
func bombPNG(width, height uint32) []byte {
	var b bytes.Buffer
	b.WriteString("\x89PNG\r\n\x1a\n")
	chunk := func(typ string, data []byte) {
		binary.Write(&b, binary.BigEndian, uint32(len(data)))
		c := append([]byte(typ), data...)
		b.Write(c)
		binary.Write(&b, binary.BigEndian, crc32.ChecksumIEEE(c))
	}
	ihdr := make([]byte, 13)
	binary.BigEndian.PutUint32(ihdr[0:], width)
	binary.BigEndian.PutUint32(ihdr[4:], height)
	ihdr[8], ihdr[9] = 8, 2 // 8-bit RGB
	chunk("IHDR", ihdr)
	chunk("IDAT", []byte{0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01})
	chunk("IEND", nil)
	return b.Bytes()
}

// TestReadImage: each format recognised by content, large images
// downscaled, and anything that is not an image refused by code.
func TestReadImage(t *testing.T) {
	tb, root := newBox(t, nil)
	put := func(name string, b []byte) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(root, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	enc := func(f func(*bytes.Buffer) error) []byte {
		var b bytes.Buffer
		if err := f(&b); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	small := testImage(40, 30)
	pngBytes := enc(func(b *bytes.Buffer) error { return png.Encode(b, small) })
	put("a.png", pngBytes)
	put("photo.bin", enc(func(b *bytes.Buffer) error { return jpeg.Encode(b, small, nil) }))
	put("anim.gif", enc(func(b *bytes.Buffer) error { return gif.Encode(b, small, nil) }))
	put("tiny.webp", webpLossless)
	put("big.png", enc(func(b *bytes.Buffer) error { return png.Encode(b, testImage(3000, 1500)) }))
	put("truncated.png", pngBytes[:len(pngBytes)/2])
	put("x.png", []byte("just text, named like an image\n"))
	put("bomb.png", bombPNG(50_000, 50_000))

	for _, c := range []struct {
		path, format string
		w, h         int
		maxDim       int
	}{
		{"a.png", "png", 40, 30, 0},
		{"photo.bin", "jpeg", 40, 30, 0},
		{"anim.gif", "gif", 40, 30, 0},
		{"tiny.webp", "webp", 1, 1, 0},
		{"big.png", "png", defaultImageDimension, defaultImageDimension / 2, 0},
		{"big.png", "png", 300, 150, 300},
		{"a.png", "png", 20, 15, 20},
	} {
		t.Run(c.path, func(t *testing.T) {
			in := map[string]any{"path": c.path}
			if c.maxDim > 0 {
				in["max_dimension"] = c.maxDim
			}
			res := mustCall(t, tb, ReadImage, in)
			if res["format"] != c.format || res["mime_type"] != "image/"+c.format || res["width"] != float64(c.w) || res["height"] != float64(c.h) {
				t.Errorf("got %v %v %vx%v, want %s %dx%d", res["format"], res["mime_type"], res["width"], res["height"], c.format, c.w, c.h)
			}
			data, _ := base64.StdEncoding.DecodeString(res["data"].(string))
			cfg, format, err := image.DecodeConfig(bytes.NewReader(data))
			if err != nil || format != c.format || cfg.Width != c.w || cfg.Height != c.h {
				t.Errorf("returned data is %s %dx%d (%v)", format, cfg.Width, cfg.Height, err)
			}
			if res["bytes"] != float64(len(data)) {
				t.Errorf("bytes %v, data %d", res["bytes"], len(data))
			}
			file, _ := os.ReadFile(filepath.Join(root, c.path))
			if res["sha256"] != sha(string(file)) {
				t.Errorf("sha256 %v is not the file's", res["sha256"])
			}
		})
	}
	for _, c := range []struct {
		path string
		code policy.Code
	}{
		{"truncated.png", policy.NotAnImage},
		{"x.png", policy.NotAnImage},
		{"bomb.png", policy.TooLarge},
		{"missing.png", policy.NotFound},
		{".", policy.NotAnImage},
	} {
		t.Run(c.path, func(t *testing.T) {
			if _, err := call(t, tb, ReadImage, map[string]any{"path": c.path}); policy.CodeOf(err) != c.code {
				t.Errorf("got %v, want %s", err, c.code)
			}
		})
	}
}

// TestReadImageByteCap: the policy's byte cap holds: a photo that does
// not fit is downscaled until it does.
func TestReadImageByteCap(t *testing.T) {
	pol := policy.Default()
	pol.Limits.ImageBytes = 20 << 10
	tb, root := newBox(t, pol)
	// Noise: no encoding makes it small.
	img := image.NewRGBA(image.Rect(0, 0, 1200, 1200))
	r := rand.New(rand.NewPCG(1, 2))
	for i := range img.Pix {
		img.Pix[i] = uint8(r.Uint32())
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(root, "p.png"), b.Bytes(), 0o600)
	res := mustCall(t, tb, ReadImage, map[string]any{"path": "p.png"})
	if res["bytes"].(float64) > float64(pol.Limits.ImageBytes) || res["downscaled"] != true {
		t.Errorf("%v bytes (cap %d), downscaled %v", res["bytes"], pol.Limits.ImageBytes, res["downscaled"])
	}
}

// TestReadImagePathRules: wo can't be read back, hidden isn't there.
func TestReadImagePathRules(t *testing.T) {
	pol, _ := policy.Preset("standard")
	tb, root := newBox(t, pol)
	for _, d := range []string{"output", ".meta"} {
		os.MkdirAll(filepath.Join(root, d), 0o700)
		writePNG(t, filepath.Join(root, d, "i.png"), 2, 2)
	}
	if _, err := call(t, tb, ReadImage, map[string]any{"path": "output/i.png"}); policy.CodeOf(err) != policy.PermissionDenied {
		t.Errorf("wo: %v", err)
	}
	if _, err := call(t, tb, ReadImage, map[string]any{"path": ".meta/i.png"}); policy.CodeOf(err) != policy.NotFound {
		t.Errorf("hidden: %v", err)
	}
}
