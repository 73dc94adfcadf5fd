// Package pngstream reads a PNG image one row at a time, so an image can
// be downscaled while it is decoded and never held whole: what it holds is
// two rows of samples and the inflater. Rows come out as premultiplied
// 16-bit colour, the values image/png's image would give from RGBA64At,
// so a downscale from here equals one from the whole decoded image.
// Adam7-interlaced images are not read: their rows are complete only
// after the last pass.
package pngstream

import (
	"bufio"
	"compress/zlib"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"image/color"
	"io"
)

// ErrInterlaced answers NewReader of an Adam7-interlaced PNG.
var ErrInterlaced = errors.New("png: interlaced images are not read a row at a time")

// Reader reads a PNG's rows in order.
type Reader struct {
	Width, Height int

	r          *bufio.Reader
	depth, ct  byte
	palette    []color.NRGBA
	trns       []byte // the tRNS chunk of a grey or RGB image
	bpp        int    // bytes a pixel, at least 1, for the filters
	cur, prev  []byte
	inflate    io.ReadCloser
	idat       *idatReader
	y          int
	bitsPerPix int
	// The first chunk after the image data, once the data's reader has
	// met it.
	next    string
	nextLen uint32
}

// NewReader reads the PNG in r up to its first image data.
func NewReader(r io.Reader) (*Reader, error) {
	d := &Reader{r: bufio.NewReaderSize(r, 32<<10)}
	var sig [8]byte
	if _, err := io.ReadFull(d.r, sig[:]); err != nil || string(sig[:]) != "\x89PNG\r\n\x1a\n" {
		return nil, errors.New("png: not a PNG file")
	}
	seenIHDR := false
	for {
		n, typ, err := d.chunkHeader()
		if err != nil {
			return nil, err
		}
		if typ == "IDAT" {
			if !seenIHDR || (d.ct == 3 && d.palette == nil) {
				return nil, errors.New("png: image data before its header or palette")
			}
			d.idat = &idatReader{d: d, left: n, crc: crcOf(typ)}
			break
		}
		data, err := d.chunkData(typ, n)
		if err != nil {
			return nil, err
		}
		switch typ {
		case "IHDR":
			if err := d.header(data); err != nil {
				return nil, err
			}
			seenIHDR = true
		case "PLTE":
			if len(data)%3 != 0 || len(data) == 0 || len(data) > 256*3 {
				return nil, errors.New("png: bad palette length")
			}
			for i := 0; i < len(data); i += 3 {
				d.palette = append(d.palette, color.NRGBA{data[i], data[i+1], data[i+2], 0xff})
			}
		case "tRNS":
			if d.ct == 3 {
				for i, a := range data {
					if i < len(d.palette) {
						d.palette[i].A = a
					}
				}
			} else {
				d.trns = data
			}
		case "IEND":
			return nil, errors.New("png: no image data")
		}
	}
	zr, err := zlib.NewReader(d.idat)
	if err != nil {
		return nil, fmt.Errorf("png: %w", err)
	}
	d.inflate = zr
	rowBytes := (d.bitsPerPix*d.Width + 7) / 8
	d.cur, d.prev = make([]byte, 1+rowBytes), make([]byte, 1+rowBytes)
	return d, nil
}

func (d *Reader) header(b []byte) error {
	if len(b) != 13 {
		return errors.New("png: bad IHDR length")
	}
	w, h := binary.BigEndian.Uint32(b[0:]), binary.BigEndian.Uint32(b[4:])
	if w == 0 || h == 0 || w > 1<<31-1 || h > 1<<31-1 {
		return errors.New("png: bad dimensions")
	}
	d.Width, d.Height, d.depth, d.ct = int(w), int(h), b[8], b[9]
	if b[10] != 0 || b[11] != 0 {
		return errors.New("png: unknown compression or filter method")
	}
	if b[12] != 0 {
		return ErrInterlaced
	}
	channels := map[byte]int{0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[d.ct]
	depths := map[byte]string{0: "\x01\x02\x04\x08\x10", 2: "\x08\x10", 3: "\x01\x02\x04\x08", 4: "\x08\x10", 6: "\x08\x10"}[d.ct]
	ok := false
	for i := range len(depths) {
		ok = ok || depths[i] == d.depth
	}
	if !ok {
		return fmt.Errorf("png: bad colour type %d with bit depth %d", d.ct, d.depth)
	}
	d.bitsPerPix = channels * int(d.depth)
	d.bpp = max(1, d.bitsPerPix/8)
	return nil
}

// chunkHeader reads a chunk's length and type.
func (d *Reader) chunkHeader() (uint32, string, error) {
	var b [8]byte
	if _, err := io.ReadFull(d.r, b[:]); err != nil {
		return 0, "", fmt.Errorf("png: %w", noEOF(err))
	}
	n := binary.BigEndian.Uint32(b[:4])
	if n > 1<<31-1 {
		return 0, "", errors.New("png: bad chunk length")
	}
	return n, string(b[4:]), nil
}

// chunkData reads a (non-IDAT) chunk's data and checks its CRC; chunks
// that matter here are small, others are skipped.
func (d *Reader) chunkData(typ string, n uint32) ([]byte, error) {
	crc := crcOf(typ)
	var data []byte
	if typ == "IHDR" || typ == "PLTE" || typ == "tRNS" {
		if n > 1<<10 {
			return nil, fmt.Errorf("png: %s chunk too long", typ)
		}
		data = make([]byte, n)
		if _, err := io.ReadFull(d.r, data); err != nil {
			return nil, fmt.Errorf("png: %w", noEOF(err))
		}
		crc.Write(data)
	} else if _, err := io.CopyN(crc, d.r, int64(n)); err != nil {
		return nil, fmt.Errorf("png: %w", noEOF(err))
	}
	return data, d.checkCRC(crc)
}

func (d *Reader) checkCRC(crc hash.Hash32) error {
	var b [4]byte
	if _, err := io.ReadFull(d.r, b[:]); err != nil {
		return fmt.Errorf("png: %w", noEOF(err))
	}
	if binary.BigEndian.Uint32(b[:]) != crc.Sum32() {
		return errors.New("png: invalid checksum")
	}
	return nil
}

func crcOf(typ string) hash.Hash32 {
	c := crc32.NewIEEE()
	c.Write([]byte(typ))
	return c
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// idatReader is the image data of consecutive IDAT chunks as one stream,
// each chunk's CRC checked at its end.
type idatReader struct {
	d    *Reader
	left uint32
	crc  hash.Hash32
	done bool // a chunk other than IDAT followed
}

func (r *idatReader) Read(p []byte) (int, error) {
	for r.left == 0 {
		if r.done {
			return 0, io.EOF
		}
		if err := r.d.checkCRC(r.crc); err != nil {
			return 0, err
		}
		n, typ, err := r.d.chunkHeader()
		if err != nil {
			return 0, err
		}
		if typ != "IDAT" {
			// The first chunk after the image data: keep it for Close.
			r.done, r.d.next, r.d.nextLen = true, typ, n
			return 0, io.EOF
		}
		r.left, r.crc = n, crcOf(typ)
	}
	n, err := r.d.r.Read(p[:min(len(p), int(r.left))])
	r.left -= uint32(n)
	r.crc.Write(p[:n])
	return n, noEOF(err)
}

// Row decodes the next row into dst (Width long). After the last row it
// reads the rest of the file, so a damaged end is an error of the last
// row; past it, Row returns io.EOF.
func (d *Reader) Row(dst []color.RGBA64) error {
	if d.y >= d.Height {
		return io.EOF
	}
	if _, err := io.ReadFull(d.inflate, d.cur); err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return errors.New("png: not enough pixel data")
		}
		return fmt.Errorf("png: %w", err)
	}
	if err := unfilter(d.cur[0], d.cur[1:], d.prev[1:], d.bpp); err != nil {
		return err
	}
	d.convert(dst[:d.Width], d.cur[1:])
	d.cur, d.prev = d.prev, d.cur
	d.y++
	if d.y == d.Height {
		return d.finish()
	}
	return nil
}

// finish checks that the image data ends with the last row (and its zlib
// checksum holds) and reads the chunks after it to IEND, as image/png does.
func (d *Reader) finish() error {
	var b [1]byte
	n, err := 0, error(nil)
	for i := 0; n == 0 && err == nil; i++ {
		if i == 100 {
			return io.ErrNoProgress
		}
		n, err = d.inflate.Read(b[:])
	}
	if err != nil && err != io.EOF {
		return fmt.Errorf("png: %w", err)
	}
	if n != 0 || d.idat.left != 0 {
		return errors.New("png: too much pixel data")
	}
	typ, size := d.next, d.nextLen
	if !d.idat.done {
		if err := d.checkCRC(d.idat.crc); err != nil {
			return err
		}
		if size, typ, err = d.chunkHeader(); err != nil {
			return err
		}
	}
	for typ != "IEND" {
		if _, err := d.chunkData(typ, size); err != nil {
			return err
		}
		if size, typ, err = d.chunkHeader(); err != nil {
			return err
		}
	}
	_, err = d.chunkData(typ, size)
	return err
}

// unfilter undoes a row's filter (PNG specification, section 9).
func unfilter(ft byte, cur, prev []byte, bpp int) error {
	switch ft {
	case 0:
	case 1: // sub
		for i := bpp; i < len(cur); i++ {
			cur[i] += cur[i-bpp]
		}
	case 2: // up
		for i := range cur {
			cur[i] += prev[i]
		}
	case 3: // average
		for i := range min(bpp, len(cur)) {
			cur[i] += prev[i] / 2
		}
		for i := bpp; i < len(cur); i++ {
			cur[i] += uint8((int(cur[i-bpp]) + int(prev[i])) / 2)
		}
	case 4: // Paeth
		for i := range cur {
			var a, c int
			if i >= bpp {
				a, c = int(cur[i-bpp]), int(prev[i-bpp])
			}
			b := int(prev[i])
			p := a + b - c
			pa, pb, pc := abs(p-a), abs(p-b), abs(p-c)
			switch {
			case pa <= pb && pa <= pc:
				cur[i] += uint8(a)
			case pb <= pc:
				cur[i] += uint8(b)
			default:
				cur[i] += uint8(c)
			}
		}
	default:
		return errors.New("png: bad filter type")
	}
	return nil
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// convert turns a row of raw samples into the colours image/png's image
// gives: a grey or RGB pixel equal to the tRNS key is transparent (grey
// below 8 bits compared as image/png compares it, both scaled to 8 bits
// from the key's low byte), a palette index past the palette is opaque
// black.
func (d *Reader) convert(dst []color.RGBA64, raw []byte) {
	be := func(i int) uint16 { return binary.BigEndian.Uint16(raw[i:]) }
	trns := len(d.trns) >= 2 && d.ct == 0 || len(d.trns) >= 6 && d.ct == 2
	switch {
	case d.ct == 0 && d.depth == 16:
		for x := range dst {
			v := be(2 * x)
			if trns && v == binary.BigEndian.Uint16(d.trns) {
				dst[x] = color.RGBA64{}
			} else {
				dst[x] = color.RGBA64{v, v, v, 0xffff}
			}
		}
	case d.ct == 0:
		depth := int(d.depth)
		mask := byte(1<<depth - 1)
		scale := 0xff / mask
		var key byte
		if trns {
			key = d.trns[1] * scale
		}
		for x := range dst {
			bit := x * depth
			v := (raw[bit/8] >> (8 - depth - bit%8)) & mask * scale
			if trns && v == key {
				dst[x] = color.RGBA64{}
			} else {
				dst[x] = color.RGBA64{uint16(v) * 0x101, uint16(v) * 0x101, uint16(v) * 0x101, 0xffff}
			}
		}
	case d.ct == 2 && d.depth == 16:
		for x := range dst {
			r, g, b := be(6*x), be(6*x+2), be(6*x+4)
			if trns && r == be16(d.trns) && g == be16(d.trns[2:]) && b == be16(d.trns[4:]) {
				dst[x] = color.RGBA64{}
			} else {
				dst[x] = color.RGBA64{r, g, b, 0xffff}
			}
		}
	case d.ct == 2:
		for x := range dst {
			r, g, b := raw[3*x], raw[3*x+1], raw[3*x+2]
			if trns && r == d.trns[1] && g == d.trns[3] && b == d.trns[5] {
				dst[x] = color.RGBA64{}
			} else {
				dst[x] = color.RGBA64{uint16(r) * 0x101, uint16(g) * 0x101, uint16(b) * 0x101, 0xffff}
			}
		}
	case d.ct == 3:
		depth := int(d.depth)
		mask := byte(1<<depth - 1)
		for x := range dst {
			bit := x * depth
			i := int((raw[bit/8] >> (8 - depth - bit%8)) & mask)
			c := color.NRGBA{0, 0, 0, 0xff}
			if i < len(d.palette) {
				c = d.palette[i]
			}
			dst[x] = nrgba(c)
		}
	case d.ct == 4 && d.depth == 16:
		for x := range dst {
			v := be(4 * x)
			dst[x] = nrgba64(color.NRGBA64{v, v, v, be(4*x + 2)})
		}
	case d.ct == 4:
		for x := range dst {
			v := raw[2*x]
			dst[x] = nrgba(color.NRGBA{v, v, v, raw[2*x+1]})
		}
	case d.ct == 6 && d.depth == 16:
		for x := range dst {
			dst[x] = nrgba64(color.NRGBA64{be(8 * x), be(8*x + 2), be(8*x + 4), be(8*x + 6)})
		}
	case d.ct == 6:
		for x := range dst {
			dst[x] = nrgba(color.NRGBA{raw[4*x], raw[4*x+1], raw[4*x+2], raw[4*x+3]})
		}
	}
}

func be16(b []byte) uint16 { return binary.BigEndian.Uint16(b) }

// nrgba and nrgba64 premultiply as image.NRGBA's and image.NRGBA64's
// RGBA64At do.
func nrgba(c color.NRGBA) color.RGBA64 {
	r, g, b, a := c.RGBA()
	return color.RGBA64{uint16(r), uint16(g), uint16(b), uint16(a)}
}

func nrgba64(c color.NRGBA64) color.RGBA64 {
	r, g, b, a := c.RGBA()
	return color.RGBA64{uint16(r), uint16(g), uint16(b), uint16(a)}
}

// Close releases the inflater.
func (d *Reader) Close() error {
	return d.inflate.Close()
}
