package pngstream_test

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"image"
	"image/color"
	"image/png"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/agentloom/loomfs/pngstream"
)

const w, h = 97, 61

// handMade is a w×h PNG of colour type ct and depth with random samples,
// unfiltered, with the given tRNS chunk if any: the kinds Go's encoder
// does not write.
func handMade(depth, ct byte, trns []byte) []byte {
	var b bytes.Buffer
	chunk := func(typ string, data []byte) {
		binary.Write(&b, binary.BigEndian, uint32(len(data)))
		c := append([]byte(typ), data...)
		b.Write(c)
		binary.Write(&b, binary.BigEndian, crc32.ChecksumIEEE(c))
	}
	b.WriteString("\x89PNG\r\n\x1a\n")
	ihdr := make([]byte, 13)
	binary.BigEndian.PutUint32(ihdr[0:], w)
	binary.BigEndian.PutUint32(ihdr[4:], h)
	ihdr[8], ihdr[9] = depth, ct
	chunk("IHDR", ihdr)
	if trns != nil {
		chunk("tRNS", trns)
	}
	channels := map[byte]int{0: 1, 2: 3, 4: 2, 6: 4}[ct]
	r := rand.New(rand.NewPCG(uint64(depth), uint64(ct)))
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	row := make([]byte, 1+(w*channels*int(depth)+7)/8)
	for range h {
		for i := 1; i < len(row); i++ {
			row[i] = byte(r.IntN(4)) * 0x55 // often equal to a key
		}
		zw.Write(row)
	}
	zw.Close()
	chunk("IDAT", z.Bytes()[:z.Len()/2])
	chunk("IDAT", z.Bytes()[z.Len()/2:]) // image data split across chunks
	chunk("tEXt", []byte("Comment\x00after the data"))
	chunk("IEND", nil)
	return b.Bytes()
}

// encoded is img as Go's encoder writes it (adaptive filters).
func encoded(t *testing.T, img image.Image) []byte {
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func noise(t *testing.T) map[string][]byte {
	r := rand.New(rand.NewPCG(1, 2))
	fill := func(pix []byte) {
		for i := range pix {
			pix[i] = byte(r.Uint32())
		}
	}
	rect := image.Rect(0, 0, w, h)
	gray, gray16, rgba, nrgba, rgba64, nrgba64 := image.NewGray(rect), image.NewGray16(rect), image.NewRGBA(rect), image.NewNRGBA(rect), image.NewRGBA64(rect), image.NewNRGBA64(rect)
	for _, p := range [][]byte{gray.Pix, gray16.Pix, rgba.Pix, nrgba.Pix, rgba64.Pix, nrgba64.Pix} {
		fill(p)
	}
	for i := 3; i < len(rgba.Pix); i += 4 {
		rgba.Pix[i] = 0xff // opaque: written as RGB
	}
	for i := 6; i < len(rgba64.Pix); i += 8 {
		rgba64.Pix[i], rgba64.Pix[i+1] = 0xff, 0xff
	}
	pal := func(n int) *image.Paletted {
		p := image.NewPaletted(rect, nil)
		for i := range n {
			p.Palette = append(p.Palette, color.NRGBA{uint8(i * 40), uint8(i * 3), 7, uint8(255 - i)})
		}
		for i := range p.Pix {
			p.Pix[i] = uint8(r.IntN(n))
		}
		return p
	}
	return map[string][]byte{
		"grey 8-bit":                  encoded(t, gray),
		"grey 16-bit":                 encoded(t, gray16),
		"RGB 8-bit":                   encoded(t, rgba),
		"RGBA 8-bit":                  encoded(t, nrgba),
		"RGB 16-bit":                  encoded(t, rgba64),
		"RGBA 16-bit":                 encoded(t, nrgba64),
		"palette 1-bit with alpha":    encoded(t, pal(2)),
		"palette 2-bit with alpha":    encoded(t, pal(4)),
		"palette 4-bit with alpha":    encoded(t, pal(16)),
		"palette 8-bit with alpha":    encoded(t, pal(200)),
		"grey 1-bit":                  handMade(1, 0, nil),
		"grey 2-bit with a key":       handMade(2, 0, []byte{0, 0x55}),
		"grey 4-bit with a key":       handMade(4, 0, []byte{0, 0x55}),
		"grey 8-bit with a key":       handMade(8, 0, []byte{0, 0xaa}),
		"grey 16-bit with a key":      handMade(16, 0, []byte{0x55, 0x55}),
		"RGB 8-bit with a key":        handMade(8, 2, []byte{0, 0x55, 0, 0x55, 0, 0x55}),
		"RGB 16-bit with a key":       handMade(16, 2, []byte{0x55, 0x55, 0x55, 0x55, 0x55, 0x55}),
		"grey+alpha 8-bit":            handMade(8, 4, nil),
		"grey+alpha 16-bit":           handMade(16, 4, nil),
		"RGBA 8-bit, after the data":  handMade(8, 6, nil),
		"RGBA 16-bit, after the data": handMade(16, 6, nil),
	}
}

// TestRowsAsImagePNG: every row is what image/png's image gives from
// RGBA64At, for every colour type, depth, filter and transparency.
func TestRowsAsImagePNG(t *testing.T) {
	for name, data := range noise(t) {
		t.Run(name, func(t *testing.T) {
			want, err := png.Decode(bytes.NewReader(data))
			if err != nil {
				t.Fatal(err)
			}
			d, err := pngstream.NewReader(bytes.NewReader(data))
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			row := make([]color.RGBA64, d.Width)
			for y := range h {
				if err := d.Row(row); err != nil {
					t.Fatalf("row %d: %v", y, err)
				}
				for x := range w {
					if got, want := row[x], want.(image.RGBA64Image).RGBA64At(x, y); got != want {
						t.Fatalf("(%d,%d): %v, image/png gives %v", x, y, got, want)
					}
				}
			}
			if err := d.Row(row); err != io.EOF {
				t.Errorf("past the last row: %v", err)
			}
		})
	}
}

// TestRowsRefuseDamage: what image/png refuses, the rows refuse too.
func TestRowsRefuseDamage(t *testing.T) {
	good := handMade(8, 6, nil)
	flip := func(i int) []byte {
		b := bytes.Clone(good)
		b[i] ^= 0x40
		return b
	}
	for name, data := range map[string][]byte{
		"truncated":          good[:len(good)-40],
		"no end":             good[:len(good)-12],
		"a checksum wrong":   flip(len(good) - 14),
		"image data changed": flip(60),
		"header changed":     flip(20),
		"interlaced":         interlacedHeader(),
		"not a PNG":          []byte("GIF89a, or so it says"),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := png.Decode(bytes.NewReader(data)); err == nil {
				if name != "interlaced" {
					t.Fatal("image/png reads it: not damage")
				}
			}
			d, err := pngstream.NewReader(bytes.NewReader(data))
			if name == "interlaced" && !errors.Is(err, pngstream.ErrInterlaced) {
				t.Fatalf("got %v, want ErrInterlaced", err)
			}
			if err != nil {
				return
			}
			defer d.Close()
			row := make([]color.RGBA64, d.Width)
			for {
				if err := d.Row(row); err == io.EOF {
					t.Fatal("read to the end without an error")
				} else if err != nil {
					return
				}
			}
		})
	}
}

func interlacedHeader() []byte {
	b := handMade(8, 0, nil)
	b[8+8+12] = 1
	binary.BigEndian.PutUint32(b[8+8+13:], crc32.ChecksumIEEE(b[8+4:8+8+13]))
	return b
}
