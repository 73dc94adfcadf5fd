package tools

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/imagebudget" // registers the formats with image.Decode too
	"github.com/agentloom/loomfs/pngstream"
	"github.com/agentloom/loomfs/policy"
)

// workspace_read_image: an image file for a multimodal model, recognised
// by its content (PNG, JPEG, GIF, WebP), downscaled to fit max_dimension
// and the policy's byte cap (Limits.ImageBytes).
//
// What a read may take is bounded by bytes, not pixels: before a pixel is
// decoded, package imagebudget reads the header and says what the decoder
// will allocate (16-bit samples, Adam7 passes, progressive coefficients
// and WebP transforms included); the file, that, the downscaled raster and
// the encoded answer are charged to the process's one image budget
// (imagebudget.Process). A read that could never fit it is refused
// (too_large, with the figures); one that fits but finds the budget held
// by other reads waits for it, within the call's budget, so an image is
// never refused only because another was read beside it.
//
// A PNG that is not interlaced is downscaled as it is decoded (package
// pngstream, a row at a time): the read holds rows, never the image. No
// other decoder at hand decodes downscaled: JPEG's DCT scaling is in
// libjpeg-turbo only, behind cgo, and a C decoder of hostile input in this
// process is the worse risk; an interlaced PNG's rows are whole only after
// its last pass. Those are decoded whole, then shrunk. Either way the
// shrink averages the area each pixel covers a row at a time (shrinker),
// with three rows of accumulators, where draw.CatmullRom.Scale kept a
// float64 image of the target's width and the source's height (316 MB for
// a 6300² image at 1568). Time is bounded apart from memory: images over
// maxImagePixels are refused unread.

// Image read bounds.
const (
	defaultImageDimension = 1568 // the long edge vision models work at
	maxImageDimension     = 8192
	minImageDimension     = 16
	// encoderState is what the PNG and JPEG encoders hold beside the
	// answer (a deflate compressor, filtered rows).
	encoderState = 2 << 20
	// maxImagePixels bounds the time a read may take, where the image
	// budget bounds its memory: a PNG read a row at a time holds little
	// whatever its size, but takes about a second of a core per 20–30
	// megapixels.
	maxImagePixels = 100_000_000
)

// ImageResult is what workspace_read_image returns. Data is the image
// returned (base64 in JSON), in Format with MIMEType; Width and Height are
// its size, Original* the file's. SHA256 is the file's, as the other tools
// give it; Bytes is len(Data).
type ImageResult struct {
	Path           string `json:"path"`
	Format         string `json:"format"`
	MIMEType       string `json:"mime_type"`
	Width          int    `json:"width"`
	Height         int    `json:"height"`
	OriginalFormat string `json:"original_format"`
	OriginalWidth  int    `json:"original_width"`
	OriginalHeight int    `json:"original_height"`
	Downscaled     bool   `json:"downscaled"`
	Bytes          int64  `json:"bytes"`
	FileBytes      int64  `json:"file_bytes"`
	SHA256         string `json:"sha256"`
	Data           []byte `json:"data"`
}

func handleReadImage(ctx context.Context, t *Toolbox, input json.RawMessage) (any, error) {
	var in struct {
		Path         string `json:"path"`
		MaxDimension int    `json:"max_dimension"`
	}
	if err := decode(input, &in); err != nil {
		return nil, err
	}
	maxDim := in.MaxDimension
	if maxDim == 0 {
		maxDim = defaultImageDimension
	}
	if maxDim < minImageDimension || maxDim > maxImageDimension {
		return nil, policy.Errorf(policy.InvalidInput, "max_dimension %d is out of range: allowed %d–%d pixels", maxDim, minImageDimension, maxImageDimension)
	}
	rel, err := t.resolve(policy.OpRead, in.Path)
	if err != nil {
		return nil, err
	}
	lim := t.WS.Policy().Limits
	f, info, err := t.WS.Open(policy.OpRead, rel, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if info.Kind != policy.KindRegular {
		return nil, policy.Errorf(policy.NotAnImage, "%s is a %s, not an image file", rel, info.Kind)
	}
	if lim.ImageSource > 0 && info.Size > lim.ImageSource {
		return nil, policy.Errorf(policy.TooLarge, "%s is %s; the image read limit is %s", rel, policy.Bytes(info.Size), policy.Bytes(lim.ImageSource))
	}
	cost, err := imagebudget.Estimate(f, info.Size)
	if err != nil {
		return nil, policy.Errorf(policy.NotAnImage, "%s is not a PNG, JPEG, GIF or WebP image (by its content)", rel)
	}
	if px := int64(cost.Width) * int64(cost.Height); px > maxImagePixels {
		return nil, policy.Errorf(policy.TooLarge, "%s claims %d×%d pixels (%d megapixels); images over %d megapixels are refused without decoding, as reading one takes too long; read a smaller copy of it instead", rel, cost.Width, cost.Height, px/1_000_000, maxImagePixels/1_000_000)
	}
	need := readCost(cost, info.Size, maxDim, lim.ImageBytes)
	release, err := imagebudget.Process.Acquire(ctx, need)
	if tl := (*imagebudget.TooLargeError)(nil); errors.As(err, &tl) {
		why := " (it is decoded whole before it is downscaled)"
		if streamed(cost, maxDim) {
			why = ""
		}
		return nil, policy.Errorf(policy.TooLarge, "%s is a %d×%d %s; reading it would take %s of memory, over the %s an image read may take%s; read a smaller copy of it instead", rel, cost.Width, cost.Height, cost.Form, policy.Bytes(need), policy.Bytes(tl.Limit), why)
	}
	if err != nil {
		return nil, policy.WaitEnded(ctx, "image read of %s waited for memory other image reads hold (it needs %s of %s)", rel, policy.Bytes(need), policy.Bytes(imagebudget.Process.Limit()))
	}
	// Released after readImage has returned, when nothing it decoded is
	// referenced any more.
	defer release()
	return readImage(ctx, f, rel, info.Size, cost, maxDim, lim.ImageBytes)
}

// readCost is what a read of an image of cost c, in a file of size bytes,
// holds at most: the file, the decoded image (or, for a PNG read a row at
// a time, its rows), the downscaled raster and the encoded answer (in a
// buffer that grows by doubling).
func readCost(c imagebudget.Cost, size int64, maxDim int, capBytes int64) int64 {
	if c.Width <= maxDim && c.Height <= maxDim && size <= capBytes {
		return size + c.Decode // returned as it is
	}
	need := size + c.Decode
	if w, h := fitSize(c.Width, c.Height, maxDim); w != c.Width || h != c.Height {
		if streamed(c, maxDim) {
			// Two rows of raw samples (8 bytes a pixel at most), a row of
			// colours, the inflater.
			need = size + 3*8*int64(c.Width) + 1<<20
		}
		need += 4*int64(w)*int64(h) + shrinkRows*4*8*int64(w) + 8*int64(c.Width)
	}
	return need + 3*capBytes + encoderState
}

// streamed says whether an image of cost c is downscaled while it is
// decoded (package pngstream) rather than decoded whole first: a PNG that
// is not interlaced, larger than maxDim.
func streamed(c imagebudget.Cost, maxDim int) bool {
	return c.Format == "png" && !c.Interlaced && (c.Width > maxDim || c.Height > maxDim)
}

// readImage reads and decodes the image in f, whose cost Estimate gave
// before the budget was charged for it, and returns it as the answer.
func readImage(ctx context.Context, f *os.File, rel string, size int64, cost imagebudget.Cost, maxDim int, capBytes int64) (ImageResult, error) {
	data := make([]byte, size)
	n, err := io.ReadFull(io.NewSectionReader(f, 0, size), data)
	if err != nil && err != io.ErrUnexpectedEOF {
		return ImageResult{}, policy.FromErrno(err, "read", rel)
	}
	data = data[:n]
	// What is decoded is what was charged for: a header rewritten
	// since Estimate read it is not trusted.
	if now, err := imagebudget.Estimate(bytes.NewReader(data), int64(len(data))); err != nil || now.Decode > cost.Decode || now.Width != cost.Width || now.Height != cost.Height {
		return ImageResult{}, policy.Errorf(policy.Conflict, "%s changed while it was being read; read it again once it is written", rel)
	}
	sum := sha256.Sum256(data)
	out := ImageResult{Path: rel, FileBytes: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
	format := cost.Format
	out.OriginalFormat, out.OriginalWidth, out.OriginalHeight = format, cost.Width, cost.Height
	// Small enough as it is: the file itself, untouched.
	if cost.Width <= maxDim && cost.Height <= maxDim && int64(len(data)) <= capBytes {
		if _, _, err := image.Decode(bytes.NewReader(data)); err != nil {
			return ImageResult{}, policy.Errorf(policy.NotAnImage, "%s is a damaged %s image: %v", rel, format, err)
		}
		out.Format, out.MIMEType, out.Width, out.Height = format, mimeOf(format), cost.Width, cost.Height
		out.Data, out.Bytes = data, int64(len(data))
		return out, nil
	}
	if err := ctx.Err(); err != nil {
		return ImageResult{}, policy.Errorf(policy.Cancelled, "image read of %s cancelled", rel)
	}
	stream := streamed(cost, maxDim)
	var img image.Image
	if !stream {
		if img, _, err = image.Decode(bytes.NewReader(data)); err != nil {
			return ImageResult{}, policy.Errorf(policy.NotAnImage, "%s is a damaged %s image: %v", rel, format, err)
		}
		data = nil // the file's bytes are no longer needed
	}
	// Photographs go out as JPEG; drawings (PNG, GIF) stay lossless
	// unless they can't fit the cap that way.
	enc := "png"
	if format == "jpeg" || format == "webp" {
		enc = "jpeg"
	}
	var raster []byte // one raster, reused by each smaller try
	dim := maxDim
	for try := 0; ; try++ {
		if err := ctx.Err(); err != nil {
			return ImageResult{}, policy.Errorf(policy.Cancelled, "image read of %s cancelled", rel)
		}
		small := img
		if w, h := fitSize(cost.Width, cost.Height, dim); w != cost.Width || h != cost.Height {
			if raster == nil {
				raster = make([]byte, 4*w*h)
			}
			if stream {
				if small, err = shrinkPNG(ctx, data, raster, w, h); err != nil {
					if ctx.Err() != nil {
						return ImageResult{}, policy.Errorf(policy.Cancelled, "image read of %s cancelled", rel)
					}
					return ImageResult{}, policy.Errorf(policy.NotAnImage, "%s is a damaged %s image: %v", rel, format, err)
				}
			} else {
				small = shrink(img, raster, w, h)
			}
		}
		b, err := encodeImage(small, enc, capBytes)
		if err != nil && !errors.Is(err, errOverCap) {
			return ImageResult{}, fmt.Errorf("encode %s: %w", rel, err)
		}
		if err == nil {
			bounds := small.Bounds()
			out.Format, out.MIMEType, out.Width, out.Height = enc, mimeOf(enc), bounds.Dx(), bounds.Dy()
			out.Downscaled = bounds.Dx() != cost.Width || bounds.Dy() != cost.Height
			out.Data, out.Bytes = b, int64(len(b))
			return out, nil
		}
		switch {
		case enc == "png":
			enc = "jpeg"
		case dim > minImageDimension*4 && try < 12:
			dim = dim * 3 / 4
		default:
			return ImageResult{}, policy.Errorf(policy.TooLarge, "%s does not fit the image limit of %s even downscaled", rel, policy.Bytes(capBytes))
		}
	}
}

// fitSize is the size of a w×h image scaled down, keeping its aspect, so
// neither side exceeds dim.
func fitSize(w, h, dim int) (int, int) {
	switch {
	case w <= dim && h <= dim:
		return w, h
	case w >= h:
		return dim, max(1, int(int64(h)*int64(dim)/int64(w)))
	default:
		return max(1, int(int64(w)*int64(dim)/int64(h))), dim
	}
}

// shrinkRows is how many rows of four float64 a shrinker keeps.
const shrinkRows = 3

// shrinker scales an sw×sh image down to w×h into an RGBA image, each
// pixel the average of the source area it covers (a box filter with exact
// weights), given the source one row at a time: a row is averaged across
// into row, and row is added into the one or two destination rows it
// overlaps (acc, next); a finished destination row is written out. In
// units where a source pixel is w across and h down and a destination
// pixel sw and sh, both images have the same size.
type shrinker struct {
	dst              *image.RGBA
	sw, sh, w, h, sy int
	row, acc, next   []float64
}

func newShrinker(pix []byte, sw, sh, w, h int) *shrinker {
	return &shrinker{
		dst: &image.RGBA{Pix: pix[:4*w*h], Stride: 4 * w, Rect: image.Rect(0, 0, w, h)},
		sw:  sw, sh: sh, w: w, h: h,
		row: make([]float64, 4*w), acc: make([]float64, 4*w), next: make([]float64, 4*w),
	}
}

// add takes the next source row (sw pixels).
func (s *shrinker) add(src []color.RGBA64) {
	w, h, sw, sh := s.w, s.h, s.sw, s.sh
	row := s.row
	clear(row)
	for sx, c := range src[:sw] {
		v := [4]float64{float64(c.R), float64(c.G), float64(c.B), float64(c.A)}
		lo := sx * w
		dx, end := lo/sw, (lo/sw+1)*sw
		in := min(w, end-lo) // the part in column dx, the rest in dx+1
		for i := range 4 {
			row[4*dx+i] += v[i] * float64(in)
		}
		if in < w {
			for i := range 4 {
				row[4*dx+4+i] += v[i] * float64(w-in)
			}
		}
	}
	lo := s.sy * h
	dy, end := lo/sh, (lo/sh+1)*sh
	in := min(h, end-lo)
	for i, v := range row {
		s.acc[i] += v * float64(in)
	}
	if in < h {
		for i, v := range row {
			s.next[i] += v * float64(h-in)
		}
	}
	if lo+h >= end {
		area := float64(sw) * float64(sh)
		out := s.dst.Pix[dy*s.dst.Stride : dy*s.dst.Stride+4*w]
		for i, v := range s.acc {
			out[i] = uint8(v/area/257 + 0.5)
		}
		s.acc, s.next = s.next, s.acc
		clear(s.next)
	}
	s.sy++
}

// shrink scales the decoded src down to w×h into an RGBA image over pix
// (4·w·h bytes at least).
func shrink(src image.Image, pix []byte, w, h int) *image.RGBA {
	sb := src.Bounds()
	s := newShrinker(pix, sb.Dx(), sb.Dy(), w, h)
	at := rgba64At(src)
	row := make([]color.RGBA64, sb.Dx())
	for y := sb.Min.Y; y < sb.Max.Y; y++ {
		for x := range row {
			row[x] = at(sb.Min.X+x, y)
		}
		s.add(row)
	}
	return s.dst
}

// shrinkPNG decodes the PNG in data a row at a time, shrinking each row
// into w×h over pix as it comes: the image is never held whole. A damaged
// file is an error, as from image.Decode; so is ctx ending.
func shrinkPNG(ctx context.Context, data, pix []byte, w, h int) (*image.RGBA, error) {
	d, err := pngstream.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	defer d.Close()
	s := newShrinker(pix, d.Width, d.Height, w, h)
	row := make([]color.RGBA64, d.Width)
	for y := range d.Height {
		if y%64 == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err := d.Row(row); err != nil {
			return nil, err
		}
		s.add(row)
	}
	return s.dst, nil
}

// rgba64At returns src's pixel reader that allocates nothing (every image
// the decoders return has RGBA64At).
func rgba64At(src image.Image) func(x, y int) color.RGBA64 {
	if m, ok := src.(image.RGBA64Image); ok {
		return m.RGBA64At
	}
	return func(x, y int) color.RGBA64 {
		r, g, b, a := src.At(x, y).RGBA()
		return color.RGBA64{uint16(r), uint16(g), uint16(b), uint16(a)}
	}
}

// errOverCap ends an encode whose output has passed the cap: no need to
// finish it to know it does not fit.
var errOverCap = errors.New("over the image byte cap")

// cappedBuffer is a bytes.Buffer that refuses to grow past max bytes.
type cappedBuffer struct {
	bytes.Buffer
	max int64
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	if int64(c.Len()+len(p)) > c.max {
		return 0, errOverCap
	}
	return c.Buffer.Write(p)
}

func encodeImage(img image.Image, format string, capBytes int64) ([]byte, error) {
	buf := &cappedBuffer{max: capBytes}
	var err error
	switch format {
	case "png":
		err = (&png.Encoder{CompressionLevel: png.BestSpeed}).Encode(buf, img)
	default:
		err = jpeg.Encode(buf, img, &jpeg.Options{Quality: 85})
	}
	return buf.Bytes(), err
}

func mimeOf(format string) string {
	return "image/" + format
}
