package tools

import (
	"bytes"
	"compress/zlib"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/agentloom/loomfs/imagebudget"
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

// pngChunk appends one PNG chunk to b.
func pngChunk(b *bytes.Buffer, typ string, data []byte) {
	binary.Write(b, binary.BigEndian, uint32(len(data)))
	c := append([]byte(typ), data...)
	b.Write(c)
	binary.Write(b, binary.BigEndian, crc32.ChecksumIEEE(c))
}

// adam7 is the PNG interlace passes: offsets and steps across and down.
var adam7 = [7][4]int{{0, 0, 8, 8}, {4, 0, 8, 8}, {0, 4, 4, 8}, {2, 0, 4, 4}, {0, 2, 2, 4}, {1, 0, 2, 2}, {0, 1, 1, 2}}

// solidPNG is a valid w×h PNG of colour type ct (0 grey, 6 RGBA) and
// depth, Adam7-interlaced or not, every sample one value: whatever its
// size, the file is small, and it is made a row at a time.
func solidPNG(t testing.TB, w, h int, depth, ct byte, interlaced bool) []byte {
	t.Helper()
	var b bytes.Buffer
	b.WriteString("\x89PNG\r\n\x1a\n")
	ihdr := make([]byte, 13)
	binary.BigEndian.PutUint32(ihdr[0:], uint32(w))
	binary.BigEndian.PutUint32(ihdr[4:], uint32(h))
	ihdr[8], ihdr[9] = depth, ct
	passes := [][4]int{{0, 0, 1, 1}}
	if interlaced {
		ihdr[12] = 1
		passes = adam7[:]
	}
	pngChunk(&b, "IHDR", ihdr)
	channels := map[byte]int{0: 1, 2: 3, 4: 2, 6: 4}[ct]
	var z bytes.Buffer
	zw, err := zlib.NewWriterLevel(&z, zlib.BestSpeed)
	if err != nil {
		t.Fatal(err)
	}
	row := bytes.Repeat([]byte{0x9c}, 1+(w*channels*int(depth)+7)/8)
	row[0] = 0 // filter: none
	for _, p := range passes {
		pw, ph := (w-p[0]+p[2]-1)/p[2], (h-p[1]+p[3]-1)/p[3]
		if pw <= 0 || ph <= 0 {
			continue
		}
		for range ph {
			if _, err := zw.Write(row[:1+(pw*channels*int(depth)+7)/8]); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	pngChunk(&b, "IDAT", z.Bytes())
	pngChunk(&b, "IEND", nil)
	return b.Bytes()
}

// solidWebP is a valid lossless WebP (VP8L) of w×h pixels of one colour,
// written by hand: no transforms, no colour cache, and five prefix codes
// of one symbol each, so a pixel takes no bits at all.
func solidWebP(w, h int) []byte {
	if w > 1<<14 || h > 1<<14 {
		panic("a lossless WebP's sides are at most 16384")
	}
	var out []byte
	var acc uint64
	var n uint
	put := func(v uint64, bits uint) { // least significant bit first
		acc |= v << n
		for n += bits; n >= 8; n -= 8 {
			out = append(out, byte(acc))
			acc >>= 8
		}
	}
	put(0x2f, 8) // signature
	put(uint64(w-1), 14)
	put(uint64(h-1), 14)
	put(0, 1+3) // alpha hint, version 0
	put(0, 1)   // no transform
	put(0, 1)   // no colour cache
	put(0, 1)   // no meta prefix codes
	// Green, red, blue and alpha: one 8-bit symbol each.
	for _, sym := range []uint64{0x40, 0x80, 0xc0, 0xff} {
		put(1, 1)   // simple code
		put(0, 1)   // one symbol
		put(1, 1)   // of 8 bits
		put(sym, 8) // the symbol
	}
	put(1, 1) // distance: simple code,
	put(0, 1) // one symbol
	put(0, 1) // of 1 bit:
	put(0, 1) // 0
	put(0, 7)
	// Trailing zeros, so the decoder's look-ahead never meets the end.
	out = append(out, make([]byte, 16)...)
	var b bytes.Buffer
	b.WriteString("RIFF")
	binary.Write(&b, binary.LittleEndian, uint32(4+8+len(out)))
	b.WriteString("WEBPVP8L")
	binary.Write(&b, binary.LittleEndian, uint32(len(out)))
	b.Write(out)
	return b.Bytes()
}

// manyFrameGIF is a w×h GIF of frames identical frames, each the whole
// screen: the file repeats one encoded frame.
func manyFrameGIF(t testing.TB, w, h, frames int) []byte {
	t.Helper()
	p := image.NewPaletted(image.Rect(0, 0, w, h), color.Palette{color.Black, color.White})
	for i := range p.Pix {
		p.Pix[i] = uint8(i / w % 2)
	}
	enc := func(n int) []byte {
		g := &gif.GIF{}
		for range n {
			g.Image, g.Delay = append(g.Image, p), append(g.Delay, 1)
		}
		var b bytes.Buffer
		if err := gif.EncodeAll(&b, g); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	two, three := enc(2), enc(3)
	frame := len(three) - len(two)
	head := two[:len(two)-1-2*frame]
	one := two[len(head) : len(head)+frame]
	out := append([]byte{}, head...)
	for range frames {
		out = append(out, one...)
	}
	return append(out, 0x3b)
}

// sideAtCap is the largest square side whose image, as header gives it
// (a file of up to 1 MiB), a read at the default max_dimension may take
// within the image budget.
func sideAtCap(t testing.TB, header func(side int) []byte) int {
	t.Helper()
	fits := func(side int) bool {
		h := header(side)
		c, err := imagebudget.Estimate(bytes.NewReader(h), int64(len(h)))
		if err != nil {
			t.Fatal(err)
		}
		return readCost(c, 1<<20, defaultImageDimension, policy.Default().Limits.ImageBytes) <= imagebudget.Limit
	}
	lo, hi := 1, 1<<14 // a lossless WebP's sides are 14 bits
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if fits(mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// hostileImage is one of the images issue 43 asks image reads to survive.
type hostileImage struct {
	name string
	make func(t testing.TB) []byte
	code policy.Code // "" for an image that is read,
	w, h int         // of this size
	// message holds what a refusal must say (the figures).
	message []string
}

func hostileImages(t testing.TB) []hostileImage {
	pngSide := sideAtCap(t, func(s int) []byte { return bombPNGOf(uint32(s), uint32(s), 16, 6, true) })
	webpSide := sideAtCap(t, func(s int) []byte { return solidWebP(s, s) })
	return []hostileImage{
		{name: "interlaced 16-bit RGBA at the cap", make: func(t testing.TB) []byte { return solidPNG(t, pngSide, pngSide, 16, 6, true) }, w: pngSide, h: pngSide},
		{name: "interlaced 16-bit RGBA just over the cap", make: func(testing.TB) []byte { return bombPNGOf(uint32(pngSide+64), uint32(pngSide+64), 16, 6, true) },
			code: policy.TooLarge, message: []string{fmt.Sprintf("%d×%d 16-bit RGBA PNG, interlaced", pngSide+64, pngSide+64), "192 MiB"}},
		{name: "interlaced 16-bit RGBA 6300² of 483 KB", make: func(t testing.TB) []byte { return solidPNG(t, 6300, 6300, 16, 6, true) },
			code: policy.TooLarge, message: []string{"6300×6300 16-bit RGBA PNG, interlaced", "MiB of memory, over the 192 MiB", "read a smaller copy"}},
		{name: "50,000² header", make: func(testing.TB) []byte { return bombPNG(50_000, 50_000) },
			code: policy.TooLarge, message: []string{"50000×50000 pixels (2500 megapixels)", "over 100 megapixels"}},
		{name: "20,000² single-colour bomb", make: func(t testing.TB) []byte { return solidPNG(t, 20_000, 20_000, 1, 0, false) },
			code: policy.TooLarge, message: []string{"20000×20000 pixels (400 megapixels)", "over 100 megapixels"}},
		{name: "16-bit RGBA 8000×5000, not interlaced (305 MiB decoded whole, read a row at a time)", make: func(t testing.TB) []byte { return solidPNG(t, 8000, 5000, 16, 6, false) }, w: 8000, h: 5000},
		{name: "200-frame GIF", make: func(t testing.TB) []byte { return manyFrameGIF(t, 2000, 1600, 200) }, w: 2000, h: 1600},
		{name: "lossless WebP at the cap", make: func(testing.TB) []byte { return solidWebP(webpSide, webpSide) }, w: webpSide, h: webpSide},
		{name: "lossless WebP just over the cap", make: func(testing.TB) []byte { return solidWebP(webpSide+64, webpSide+64) },
			code: policy.TooLarge, message: []string{"lossless WebP"}},
	}
}

// bombPNGOf is a PNG header of any colour type and depth with one tiny
// IDAT: the outline of a decompression bomb.
func bombPNGOf(width, height uint32, depth, ct byte, interlaced bool) []byte {
	var b bytes.Buffer
	b.WriteString("\x89PNG\r\n\x1a\n")
	ihdr := make([]byte, 13)
	binary.BigEndian.PutUint32(ihdr[0:], width)
	binary.BigEndian.PutUint32(ihdr[4:], height)
	ihdr[8], ihdr[9] = depth, ct
	if interlaced {
		ihdr[12] = 1
	}
	pngChunk(&b, "IHDR", ihdr)
	pngChunk(&b, "IDAT", []byte{0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01})
	pngChunk(&b, "IEND", nil)
	return b.Bytes()
}

// TestReadImageHostile: each hostile image of issue 43 is read, or
// refused with the figures, within the image budget.
func TestReadImageHostile(t *testing.T) {
	tb, root := newBox(t, nil)
	for _, c := range hostileImages(t) {
		t.Run(c.name, func(t *testing.T) {
			if err := os.WriteFile(filepath.Join(root, "h.img"), c.make(t), 0o600); err != nil {
				t.Fatal(err)
			}
			res, err := call(t, tb, ReadImage, map[string]any{"path": "h.img"})
			if c.code == "" {
				if err != nil {
					t.Fatalf("read: %v", err)
				}
				if res["original_width"] != float64(c.w) || res["original_height"] != float64(c.h) {
					t.Errorf("read as %v×%v, made %d×%d", res["original_width"], res["original_height"], c.w, c.h)
				}
				if res["downscaled"] != true || res["bytes"].(float64) > float64(policy.Default().Limits.ImageBytes) {
					t.Errorf("%v×%v, %v bytes, downscaled %v", res["width"], res["height"], res["bytes"], res["downscaled"])
				}
				return
			}
			pe := wantCode(t, err, c.code)
			for _, m := range c.message {
				if !strings.Contains(pe.Message, m) {
					t.Errorf("message %q does not say %q", pe.Message, m)
				}
			}
		})
	}
	if used := imagebudget.Process.Used(); used != 0 {
		t.Errorf("%d bytes of the image budget still held after the reads", used)
	}
}

// TestReadImageMemory: the hostile images read one at a time, then by
// four callers at once, in a child process whose memory high-water mark
// (VmHWM, from when the images are in place) stays within 256 MiB and
// 512 MiB. bench/image-memory.sh prints the same figures.
func TestReadImageMemory(t *testing.T) {
	if raceBuild() {
		t.Skip("the race detector multiplies a process's memory; measured without -race")
	}
	for _, c := range []struct {
		mode  string
		limit int64
	}{{"one", 256 << 20}, {"four", 512 << 20}} {
		t.Run(c.mode, func(t *testing.T) {
			hwm, out := imageMemoryChild(t, c.mode)
			t.Logf("%s at a time: VmHWM %s", c.mode, policy.Bytes(hwm))
			if hwm > c.limit {
				t.Errorf("%s at a time: VmHWM %s, over %s\n%s", c.mode, policy.Bytes(hwm), policy.Bytes(c.limit), out)
			}
		})
	}
}

// imageMemoryChild runs TestReadImageMemoryChild in a new process and
// returns the high-water mark it printed.
func imageMemoryChild(t *testing.T, mode string) (int64, []byte) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestReadImageMemoryChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "LOOMFS_IMAGE_MEMORY="+mode)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`image_memory_vmhwm_kib=(\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("child printed no high-water mark:\n%s", out)
	}
	kib, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return kib << 10, out
}

// TestReadImageMemoryChild is TestReadImageMemory's child: it reads the
// hostile images as LOOMFS_IMAGE_MEMORY says (one: each in turn; four:
// four callers at once, each through all of them) and prints its VmHWM;
// dump only writes them into LOOMFS_IMAGE_DIR.
func TestReadImageMemoryChild(t *testing.T) {
	mode := os.Getenv("LOOMFS_IMAGE_MEMORY")
	if mode == "" {
		t.Skip("run by TestReadImageMemory in a child process")
	}
	tb, root := newBox(t, nil)
	imgs := hostileImages(t)
	if mode == "dump" { // bench/image-memory.sh reads them with loomfs tool
		root = os.Getenv("LOOMFS_IMAGE_DIR")
	}
	for i, c := range imgs {
		if err := os.WriteFile(filepath.Join(root, fmt.Sprintf("h%d.img", i)), c.make(t), 0o600); err != nil {
			t.Fatal(err)
		}
		fmt.Printf("image h%d.img: %s\n", i, c.name)
	}
	if mode == "dump" {
		return
	}
	// Count the reads, not the making of the images: collect, then
	// reset the high-water mark to what is resident now.
	runtime.GC()
	debug.FreeOSMemory()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Fatal(err)
	}
	callers := map[string]int{"one": 1, "four": 4}[mode]
	var wg sync.WaitGroup
	errs := make(chan error, callers*len(imgs))
	for g := range callers {
		wg.Go(func() {
			for k := range imgs {
				i := (k + 2*g) % len(imgs)
				in, _ := json.Marshal(map[string]any{"path": fmt.Sprintf("h%d.img", i)})
				_, err := tb.Call(context.Background(), ReadImage, "", in)
				if policy.CodeOf(err) != imgs[i].code && !(err == nil && imgs[i].code == "") {
					errs <- fmt.Errorf("%s: %v", imgs[i].name, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`VmHWM:\s+(\d+) kB`).FindSubmatch(status)
	if m == nil {
		t.Fatalf("no VmHWM in /proc/self/status")
	}
	fmt.Printf("image_memory_vmhwm_kib=%s\n", m[1])
}

// TestShrinkPNGAsWhole: a PNG downscaled as it is decoded, a row at a
// time, is the very image that decoding it whole and then downscaling
// gives.
func TestShrinkPNGAsWhole(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, c := range []struct {
		name string
		img  image.Image
		w, h int
	}{
		{name: "RGBA noise, a third", img: image.NewNRGBA(image.Rect(0, 0, 301, 203)), w: 100, h: 67},
		{name: "16-bit RGBA noise, by 1.5", img: image.NewNRGBA64(image.Rect(0, 0, 300, 200)), w: 200, h: 133},
		{name: "grey noise, to one pixel", img: image.NewGray(image.Rect(0, 0, 50, 40)), w: 1, h: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			pix := pixOf(c.img)
			for i := range pix {
				pix[i] = uint8(r.Uint32())
			}
			var b bytes.Buffer
			if err := png.Encode(&b, c.img); err != nil {
				t.Fatal(err)
			}
			whole, err := png.Decode(bytes.NewReader(b.Bytes()))
			if err != nil {
				t.Fatal(err)
			}
			want := shrink(whole, make([]byte, 4*c.w*c.h), c.w, c.h)
			got, err := shrinkPNG(context.Background(), b.Bytes(), make([]byte, 4*c.w*c.h), c.w, c.h)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Pix, want.Pix) {
				t.Errorf("row by row differs from whole")
			}
			// And the average is the average: a flat image stays flat.
			if c.w == 1 {
				var sum float64
				g := whole.(*image.Gray)
				for _, v := range g.Pix {
					sum += float64(v)
				}
				if mean := sum / float64(len(g.Pix)); math.Abs(float64(got.Pix[0])-mean) > 0.51 {
					t.Errorf("one pixel of %d, the mean is %.2f", got.Pix[0], mean)
				}
			}
		})
	}
}

func pixOf(img image.Image) []byte {
	switch m := img.(type) {
	case *image.NRGBA:
		return m.Pix
	case *image.NRGBA64:
		return m.Pix
	case *image.Gray:
		return m.Pix
	}
	return nil
}

// raceBuild says whether this test binary was built with -race.
func raceBuild() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, st := range bi.Settings {
		if st.Key == "-race" {
			return st.Value == "true"
		}
	}
	return false
}
