package imagebudget

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"image"
	_ "image/gif" // registers GIF with image.DecodeConfig
	_ "image/jpeg"
	_ "image/png"
	"io"

	_ "golang.org/x/image/webp" // registers WebP with image.DecodeConfig
)

// ErrNotImage answers Estimate of something that is not a PNG, JPEG, GIF
// or WebP image by its content.
var ErrNotImage = errors.New("not a PNG, JPEG, GIF or WebP image")

// overhead is what a decode allocates beside its images: inflate windows,
// Huffman tables, buffered readers.
const overhead = 1 << 20

// Cost is what decoding one image takes, known from its header.
type Cost struct {
	Format        string // as image.Decode names it: png, jpeg, gif, webp
	Width, Height int
	// Decode is the most the decoder allocates for it (image.Decode,
	// golang.org/x/image/webp), garbage it leaves before it returns
	// included.
	Decode int64
	// Form says what is decoded, for a message: "16-bit RGBA, interlaced".
	Form string
	// Interlaced is set for an Adam7-interlaced PNG, whose rows are
	// complete only after its last pass.
	Interlaced bool
}

// Estimate reads the header of the image in r (size bytes) and what the
// decoders will allocate for it. It reads headers and marker segments
// only: for JPEG that means every marker of the file (the decoder decides
// RGB or YCbCr from markers that may follow the frame header), skipping
// the entropy-coded data between them; for PNG the chunks before the first
// IDAT; for WebP the chunk headers. The dimensions are the ones the decoder
// will use (the WebP decoder checks a frame against its VP8X canvas, the
// GIF decoder a frame against its screen, the JPEG decoder refuses a second
// frame header).
func Estimate(r io.ReaderAt, size int64) (Cost, error) {
	cfg, format, err := image.DecodeConfig(io.NewSectionReader(r, 0, size))
	if err != nil {
		return Cost{}, fmt.Errorf("%w: %v", ErrNotImage, err)
	}
	if cfg.Width <= 0 || cfg.Height <= 0 {
		return Cost{}, fmt.Errorf("%w: it claims %d×%d pixels", ErrNotImage, cfg.Width, cfg.Height)
	}
	c := Cost{Format: format, Width: cfg.Width, Height: cfg.Height}
	w, h := int64(cfg.Width), int64(cfg.Height)
	if w*h > 1<<40 {
		// Beyond any budget; the figures below would overflow.
		c.Decode, c.Form = 1<<62, format
		return c, nil
	}
	switch format {
	case "png":
		c.Decode, c.Form, c.Interlaced = pngCost(r, size, w, h)
	case "jpeg":
		c.Decode, c.Form = jpegCost(io.NewSectionReader(r, 0, size), w, h)
	case "gif":
		// Only the first frame is decoded, into one byte a pixel, and an
		// interlaced frame is copied once more to put its rows in order.
		c.Decode, c.Form = 2*w*h, "GIF, first frame"
	case "webp":
		c.Decode, c.Form = webpCost(r, size, w, h)
	default:
		return Cost{}, fmt.Errorf("%w: %s", ErrNotImage, format)
	}
	c.Decode += overhead
	return c, nil
}

// pngCost: image/png decodes into the image type of its colour type and
// depth (16-bit samples as 16-bit, a grey or RGB image with a tRNS chunk
// as NRGBA), beside two rows of raw samples; an Adam7-interlaced image is
// decoded pass by pass, each pass an image of its own merged into the
// whole, so the passes cost the whole image once more.
func pngCost(r io.ReaderAt, size, w, h int64) (int64, string, bool) {
	var ihdr [13]byte
	if _, err := r.ReadAt(ihdr[:], 16); err != nil {
		return 16 * w * h, "PNG", true // DecodeConfig read it; be generous
	}
	depth, ct, interlaced := int64(ihdr[8]), ihdr[9], ihdr[12] == 1
	trns := false
	for off := int64(8 + 8 + 13 + 4); off+8 <= size; {
		var hd [8]byte
		if _, err := r.ReadAt(hd[:], off); err != nil {
			break
		}
		typ := string(hd[4:])
		if typ == "IDAT" || typ == "IEND" {
			break
		}
		trns = trns || typ == "tRNS"
		off += 12 + int64(binary.BigEndian.Uint32(hd[:4]))
	}
	wide := depth == 16
	var channels, perPixel int64
	var name string
	switch ct {
	case 0:
		channels, name = 1, "grey"
		perPixel = pick(wide, 2, 1)
		if trns {
			perPixel = pick(wide, 8, 4)
		}
	case 2:
		channels, name, perPixel = 3, "RGB", pick(wide, 8, 4)
	case 3:
		channels, name, perPixel = 1, "palette", 1
	case 4:
		channels, name, perPixel = 2, "grey+alpha", pick(wide, 8, 4)
	case 6:
		channels, name, perPixel = 4, "RGBA", pick(wide, 8, 4)
	default:
		channels, name, perPixel = 4, "unknown colour type", 8
	}
	img := w * h * perPixel
	cost := img + 2*((depth*channels*w+7)/8+1)
	form := fmt.Sprintf("%d-bit %s PNG", depth, name)
	if interlaced {
		cost += img
		form += ", interlaced"
	}
	return cost, form, interlaced
}

func pick(wide bool, ifWide, otherwise int64) int64 {
	if wide {
		return ifWide
	}
	return otherwise
}

// jpegCost: image/jpeg decodes into planes padded to whole MCUs, one byte
// a sample; a progressive image keeps every block's 64 coefficients as
// int32 until its last scan (four bytes a sample more); CMYK and RGB
// images are converted into a new 4-byte-a-pixel image at the end.
func jpegCost(r io.Reader, w, h int64) (int64, string) {
	j, err := scanJPEG(r)
	if err != nil || len(j.comps) == 0 {
		// Four components, progressive, converted: the most it can be.
		return 24 * w * h, "JPEG"
	}
	w, h = max(w, j.width), max(h, j.height)
	hmax, vmax := int64(1), int64(1)
	for _, c := range j.comps {
		hmax, vmax = max(hmax, c.h), max(vmax, c.v)
	}
	mxx, myy := (w+8*hmax-1)/(8*hmax), (h+8*vmax-1)/(8*vmax)
	var samples int64
	for _, c := range j.comps {
		samples += 64 * max(c.h, 1) * max(c.v, 1) * mxx * myy
	}
	cost := samples
	form := "baseline"
	if j.progressive {
		cost += 4 * samples
		form = "progressive"
	}
	isRGB := !j.jfif && ((j.adobe && j.adobeTransform == 0) ||
		(len(j.comps) == 3 && j.comps[0].id == 'R' && j.comps[1].id == 'G' && j.comps[2].id == 'B'))
	switch {
	case len(j.comps) == 4:
		cost += 4 * w * h
		form += " CMYK"
	case len(j.comps) == 3 && isRGB:
		cost += 4 * w * h
		form += " RGB"
	case len(j.comps) == 1:
		form += " grey"
	}
	return cost, form + " JPEG"
}

type jpegComp struct {
	id   byte
	h, v int64
}

type jpegInfo struct {
	width, height  int64
	comps          []jpegComp
	progressive    bool
	jfif, adobe    bool
	adobeTransform byte
}

// scanJPEG reads a JPEG's marker segments from SOI to EOI, skipping the
// entropy-coded data after each SOS, as image/jpeg walks them.
func scanJPEG(r io.Reader) (jpegInfo, error) {
	var j jpegInfo
	br := bufio.NewReaderSize(r, 64<<10)
	var soi [2]byte
	if _, err := io.ReadFull(br, soi[:]); err != nil || soi != [2]byte{0xff, 0xd8} {
		return j, errors.New("no SOI marker")
	}
	marker := byte(0) // a marker found while skipping entropy-coded data
	for {
		m := marker
		marker = 0
		if m == 0 {
			b, err := br.ReadByte()
			if err != nil {
				return j, err
			}
			if b != 0xff {
				continue // junk before a marker, which libjpeg allows
			}
			for b == 0xff {
				if b, err = br.ReadByte(); err != nil {
					return j, err
				}
			}
			m = b
		}
		switch {
		case m == 0xd9: // EOI
			return j, nil
		case m == 0x00 || m == 0x01 || m == 0xd8 || (m >= 0xd0 && m <= 0xd7):
			continue // no segment follows
		}
		var l [2]byte
		if _, err := io.ReadFull(br, l[:]); err != nil {
			return j, err
		}
		n := int(binary.BigEndian.Uint16(l[:])) - 2
		if n < 0 {
			return j, errors.New("bad segment length")
		}
		switch {
		case m >= 0xc0 && m <= 0xcf && m != 0xc4 && m != 0xc8 && m != 0xcc: // SOFn
			seg := make([]byte, n)
			if _, err := io.ReadFull(br, seg); err != nil {
				return j, err
			}
			if len(seg) < 6 || len(seg) < 6+3*int(seg[5]) {
				return j, errors.New("short SOF segment")
			}
			j.height, j.width = int64(binary.BigEndian.Uint16(seg[1:])), int64(binary.BigEndian.Uint16(seg[3:]))
			j.progressive = m == 0xc2 || m == 0xc6 || m == 0xca || m == 0xce
			j.comps = j.comps[:0]
			for i := range int(seg[5]) {
				c := seg[6+3*i:]
				j.comps = append(j.comps, jpegComp{id: c[0], h: int64(c[1] >> 4), v: int64(c[1] & 15)})
			}
		case m == 0xe0 || m == 0xee: // APP0 (JFIF), APP14 (Adobe)
			seg := make([]byte, n)
			if _, err := io.ReadFull(br, seg); err != nil {
				return j, err
			}
			if m == 0xe0 && bytes.HasPrefix(seg, []byte("JFIF\x00")) {
				j.jfif = true
			}
			if m == 0xee && len(seg) >= 12 && bytes.HasPrefix(seg, []byte("Adobe")) {
				j.adobe, j.adobeTransform = true, seg[11]
			}
		default:
			if _, err := br.Discard(n); err != nil {
				return j, err
			}
		}
		if m != 0xda { // SOS: entropy-coded data follows
			continue
		}
		for marker == 0 {
			if _, err := br.ReadSlice(0xff); err != nil && err != bufio.ErrBufferFull {
				return j, err
			} else if err == bufio.ErrBufferFull {
				continue
			}
			b, err := br.ReadByte()
			for err == nil && b == 0xff {
				b, err = br.ReadByte()
			}
			if err != nil {
				return j, err
			}
			if b != 0x00 && (b < 0xd0 || b > 0xd7) {
				marker = b
			}
		}
	}
}

// webpCost: golang.org/x/image/webp decodes a lossy frame into 4:2:0
// planes padded to whole macroblocks, after reading the frame's
// partitions whole; a lossless frame (VP8L) into four bytes a pixel, which
// its colour-indexing transform copies into a new image, beside
// subsampled entropy and transform images; a VP8L-compressed alpha plane
// is such a lossless frame, and is then copied into a plane of its own.
func webpCost(r io.ReaderAt, size, w, h int64) (int64, string) {
	const lossless = 9 // bytes a pixel: pixels, their copy, sub-images
	alpha, alphaCompressed := false, false
	for off := int64(12); off+8 <= size; {
		var hd [8]byte
		if _, err := r.ReadAt(hd[:], off); err != nil {
			break
		}
		n := int64(binary.LittleEndian.Uint32(hd[4:]))
		var b [1]byte
		switch string(hd[:4]) {
		case "VP8X":
			if _, err := r.ReadAt(b[:], off+8); err == nil {
				alpha = b[0]&0x10 != 0
			}
		case "ALPH":
			if _, err := r.ReadAt(b[:], off+8); err == nil {
				alphaCompressed = b[0]&0x03 == 1
			}
		case "VP8 ":
			mbw, mbh := (w+15)/16, (h+15)/16
			cost := 256*mbw*mbh*3/2 + min(n, size) + 16*mbw*mbh
			if !alpha {
				return cost, "lossy WebP"
			}
			cost += w * h
			if alphaCompressed {
				cost += lossless * w * h
			}
			return cost, "lossy WebP with alpha"
		case "VP8L":
			return lossless * w * h, "lossless WebP"
		}
		off += 8 + n + n&1
	}
	// No frame found: decoding fails; count the worst.
	return (lossless + 4) * w * h, "WebP"
}
