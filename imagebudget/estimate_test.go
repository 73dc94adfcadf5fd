package imagebudget_test

import (
	"bytes"
	"cmp"
	"compress/zlib"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/imagebudget"
)

const testW, testH = 1201, 803 // odd, so padding to blocks shows

// pngOf is a valid testW×testH PNG of colour type ct and depth, with a
// tRNS chunk if trns, Adam7-interlaced if interlaced.
func pngOf(t *testing.T, depth, ct byte, trns, interlaced bool) []byte {
	t.Helper()
	var b bytes.Buffer
	chunk := func(typ string, data []byte) {
		binary.Write(&b, binary.BigEndian, uint32(len(data)))
		c := append([]byte(typ), data...)
		b.Write(c)
		binary.Write(&b, binary.BigEndian, crc32.ChecksumIEEE(c))
	}
	b.WriteString("\x89PNG\r\n\x1a\n")
	ihdr := make([]byte, 13)
	binary.BigEndian.PutUint32(ihdr[0:], testW)
	binary.BigEndian.PutUint32(ihdr[4:], testH)
	ihdr[8], ihdr[9] = depth, ct
	passes := [][4]int{{0, 0, 1, 1}}
	if interlaced {
		ihdr[12] = 1
		passes = [][4]int{{0, 0, 8, 8}, {4, 0, 8, 8}, {0, 4, 4, 8}, {2, 0, 4, 4}, {0, 2, 2, 4}, {1, 0, 2, 2}, {0, 1, 1, 2}}
	}
	chunk("IHDR", ihdr)
	if ct == 3 {
		chunk("PLTE", bytes.Repeat([]byte{0x10, 0x80, 0xf0}, 1<<depth))
	}
	if trns {
		chunk("tRNS", make([]byte, map[byte]int{0: 2, 2: 6, 3: 1}[ct]))
	}
	channels := map[byte]int{0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[ct]
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	for _, p := range passes {
		pw, ph := (testW-p[0]+p[2]-1)/p[2], (testH-p[1]+p[3]-1)/p[3]
		row := make([]byte, 1+(pw*channels*int(depth)+7)/8)
		for y := range ph {
			for i := 1; i < len(row); i++ {
				row[i] = byte(i*7+y) & (1<<min(depth, 8) - 1)
			}
			zw.Write(row)
		}
	}
	zw.Close()
	chunk("IDAT", z.Bytes())
	chunk("IEND", nil)
	return b.Bytes()
}

func encoded(t *testing.T, f func(*bytes.Buffer) error) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := f(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func fixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// decodeAlloc is what image.Decode of data allocates, garbage included.
func decodeAlloc(t *testing.T, data []byte) uint64 {
	t.Helper()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, _, err := image.Decode(bytes.NewReader(data)); err != nil {
		t.Fatalf("decode: %v", err)
	}
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestEstimate: for each kind of image the decoders treat differently,
// the estimate is at least what decoding it allocates, and not more than
// twice that (beside the fixed overhead; the images are large enough for
// the pixels to outweigh what a decoder allocates whatever their size): the budget is neither exceeded
// nor wasted.
func TestEstimate(t *testing.T) {
	rgba := image.NewRGBA(image.Rect(0, 0, testW, testH))
	for i := range rgba.Pix {
		rgba.Pix[i] = uint8(i * 13)
	}
	grey := image.NewGray(rgba.Bounds())
	paletted := image.NewPaletted(rgba.Bounds(), color.Palette{color.Black, color.White})
	for _, c := range []struct {
		name string
		data []byte
		form string
	}{
		{"grey 8-bit", pngOf(t, 8, 0, false, false), "8-bit grey PNG"},
		{"grey 1-bit", pngOf(t, 1, 0, false, false), "1-bit grey PNG"},
		{"grey 8-bit with tRNS is NRGBA", pngOf(t, 8, 0, true, false), "8-bit grey PNG"},
		{"grey 16-bit", pngOf(t, 16, 0, false, false), "16-bit grey PNG"},
		{"grey 16-bit with tRNS is NRGBA64", pngOf(t, 16, 0, true, false), "16-bit grey PNG"},
		{"grey+alpha 8-bit", pngOf(t, 8, 4, false, false), "8-bit grey+alpha PNG"},
		{"RGB 8-bit", pngOf(t, 8, 2, false, false), "8-bit RGB PNG"},
		{"RGB 16-bit", pngOf(t, 16, 2, false, false), "16-bit RGB PNG"},
		{"RGBA 8-bit", pngOf(t, 8, 6, false, false), "8-bit RGBA PNG"},
		{"RGBA 16-bit", pngOf(t, 16, 6, false, false), "16-bit RGBA PNG"},
		{"palette 4-bit", pngOf(t, 4, 3, true, false), "4-bit palette PNG"},
		{"RGBA 16-bit interlaced", pngOf(t, 16, 6, false, true), "16-bit RGBA PNG, interlaced"},
		{"grey 1-bit interlaced", pngOf(t, 1, 0, false, true), "1-bit grey PNG, interlaced"},
		{"JPEG baseline 4:2:0", encoded(t, func(b *bytes.Buffer) error { return jpeg.Encode(b, rgba, nil) }), "baseline JPEG"},
		{"JPEG baseline grey", encoded(t, func(b *bytes.Buffer) error { return jpeg.Encode(b, grey, nil) }), "baseline grey JPEG"},
		{"JPEG progressive 4:2:0", fixture(t, "progressive.jpg"), "progressive JPEG"},
		{"JPEG progressive 4:4:4", fixture(t, "progressive-444.jpg"), "progressive JPEG"},
		{"JPEG progressive grey", fixture(t, "progressive-grey.jpg"), "progressive grey JPEG"},
		{"JPEG RGB", fixture(t, "rgb.jpg"), "baseline RGB JPEG"},
		{"GIF", encoded(t, func(b *bytes.Buffer) error { return gif.Encode(b, paletted, nil) }), "GIF, first frame"},
		{"WebP lossy", fixture(t, "lossy.webp"), "lossy WebP"},
		{"WebP lossy with alpha", fixture(t, "lossy-alpha.webp"), "lossy WebP with alpha"},
		{"WebP lossless", fixture(t, "lossless.webp"), "lossless WebP"},
	} {
		t.Run(c.name, func(t *testing.T) {
			est, err := imagebudget.Estimate(bytes.NewReader(c.data), int64(len(c.data)))
			if err != nil {
				t.Fatal(err)
			}
			if est.Width != testW || est.Height != testH || est.Form != c.form {
				t.Errorf("estimate says %d×%d %q, want %d×%d %q", est.Width, est.Height, est.Form, testW, testH, c.form)
			}
			got := decodeAlloc(t, c.data)
			pixels := est.Decode - 1<<20
			t.Logf("%s: estimated %d bytes beside the overhead, decode allocated %d", c.name, pixels, got)
			if uint64(est.Decode) < got {
				t.Errorf("estimated %d bytes, decode allocated %d", est.Decode, got)
			}
			// Whether a colour-indexing transform copies a lossless WebP's
			// pixels is known only once its sub-images are decoded, so
			// the estimate counts the copy; this image has none.
			slack := map[string]float64{"WebP lossless": 2.5}[c.name]
			if slack = cmp.Or(slack, 2); float64(pixels) > slack*float64(got) {
				t.Errorf("estimated %d bytes beside the overhead, over %g times the %d decode allocated", pixels, slack, got)
			}
		})
	}
}

// TestEstimateRefuses: what is not an image is said to be so.
func TestEstimateRefuses(t *testing.T) {
	for _, data := range [][]byte{
		[]byte("just text, named like an image\n"),
		nil,
		[]byte("\x89PNG\r\n\x1a\n"),
	} {
		if _, err := imagebudget.Estimate(bytes.NewReader(data), int64(len(data))); !errors.Is(err, imagebudget.ErrNotImage) {
			t.Errorf("%q: got %v, want ErrNotImage", data, err)
		}
	}
}

// TestEstimateHugeHeader: a header claiming more than any budget holds is
// costed beyond it, without overflow.
func TestEstimateHugeHeader(t *testing.T) {
	var b bytes.Buffer
	b.WriteString("\x89PNG\r\n\x1a\n")
	ihdr := make([]byte, 13)
	binary.BigEndian.PutUint32(ihdr[0:], 1<<31-1)
	binary.BigEndian.PutUint32(ihdr[4:], 1<<31-1)
	ihdr[8], ihdr[9] = 16, 6
	binary.Write(&b, binary.BigEndian, uint32(13))
	b.WriteString("IHDR")
	b.Write(ihdr)
	binary.Write(&b, binary.BigEndian, crc32.ChecksumIEEE(append([]byte("IHDR"), ihdr...)))
	est, err := imagebudget.Estimate(bytes.NewReader(b.Bytes()), int64(b.Len()))
	if err != nil {
		if strings.Contains(err.Error(), "dimension") {
			return // image/png refuses it itself
		}
		t.Fatal(err)
	}
	if est.Decode <= imagebudget.Limit {
		t.Errorf("a %d×%d header costed %d bytes", est.Width, est.Height, est.Decode)
	}
}
