package tools

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"image"
	"image/gif"
	"image/jpeg"
	"image/png"
	"io"

	"golang.org/x/image/draw"
	_ "golang.org/x/image/webp" // registers WebP with image.Decode
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// workspace_read_image: an image file for a multimodal model, recognised
// by its content (PNG, JPEG, GIF, WebP), downscaled to fit max_dimension
// and the policy's byte cap (Limits.ImageBytes). Its size is read from the
// header first (image.DecodeConfig), so a small file that claims a huge
// canvas (a decompression bomb) is refused before any pixel is decoded.

// Image read bounds.
const (
	defaultImageDimension = 1568 // the long edge vision models work at
	maxImageDimension     = 8192
	minImageDimension     = 16
	// maxImagePixels bounds what is decoded: 40 megapixels is 160 MiB
	// of RGBA.
	maxImagePixels = 40_000_000
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
	data, err := io.ReadAll(io.LimitReader(f, info.Size+1))
	if err != nil {
		return nil, policy.FromErrno(err, "read", rel)
	}
	sum := sha256.Sum256(data)
	out := ImageResult{Path: rel, FileBytes: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}

	cfg, format, err := image.DecodeConfig(bytes.NewReader(data))
	if err != nil {
		return nil, policy.Errorf(policy.NotAnImage, "%s is not a PNG, JPEG, GIF or WebP image (by its content)", rel)
	}
	out.OriginalFormat, out.OriginalWidth, out.OriginalHeight = format, cfg.Width, cfg.Height
	if cfg.Width <= 0 || cfg.Height <= 0 || int64(cfg.Width)*int64(cfg.Height) > maxImagePixels {
		return nil, policy.Errorf(policy.TooLarge, "%s claims %d×%d pixels; images over %d megapixels are refused without decoding", rel, cfg.Width, cfg.Height, maxImagePixels/1_000_000)
	}
	// Small enough as it is: the file itself, untouched.
	if cfg.Width <= maxDim && cfg.Height <= maxDim && int64(len(data)) <= lim.ImageBytes {
		if _, _, err := image.Decode(bytes.NewReader(data)); err != nil {
			return nil, policy.Errorf(policy.NotAnImage, "%s is a damaged %s image: %v", rel, format, err)
		}
		out.Format, out.MIMEType, out.Width, out.Height = format, mimeOf(format), cfg.Width, cfg.Height
		out.Data, out.Bytes = data, int64(len(data))
		return out, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, policy.Errorf(policy.Cancelled, "image read of %s cancelled", rel)
	}
	img, _, err := image.Decode(bytes.NewReader(data))
	if err != nil {
		return nil, policy.Errorf(policy.NotAnImage, "%s is a damaged %s image: %v", rel, format, err)
	}
	// Photographs go out as JPEG; drawings (PNG, GIF) stay lossless
	// unless they can't fit the cap that way.
	enc := "png"
	if format == "jpeg" || format == "webp" {
		enc = "jpeg"
	}
	dim := maxDim
	for try := 0; ; try++ {
		small := fit(img, dim)
		b, err := encodeImage(small, enc)
		if err != nil {
			return nil, fmt.Errorf("encode %s: %w", rel, err)
		}
		if int64(len(b)) <= lim.ImageBytes {
			bounds := small.Bounds()
			out.Format, out.MIMEType, out.Width, out.Height = enc, mimeOf(enc), bounds.Dx(), bounds.Dy()
			out.Downscaled = bounds.Dx() != cfg.Width || bounds.Dy() != cfg.Height
			out.Data, out.Bytes = b, int64(len(b))
			return out, nil
		}
		switch {
		case enc == "png":
			enc = "jpeg"
		case dim > minImageDimension*4 && try < 12:
			dim = dim * 3 / 4
		default:
			return nil, policy.Errorf(policy.TooLarge, "%s does not fit the image limit of %s even downscaled", rel, policy.Bytes(lim.ImageBytes))
		}
	}
}

// fit scales img down, keeping its aspect, so neither side exceeds dim.
func fit(img image.Image, dim int) image.Image {
	b := img.Bounds()
	w, h := b.Dx(), b.Dy()
	if w <= dim && h <= dim {
		return img
	}
	if w >= h {
		w, h = dim, max(1, h*dim/w)
	} else {
		w, h = max(1, w*dim/h), dim
	}
	dst := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.CatmullRom.Scale(dst, dst.Bounds(), img, b, draw.Over, nil)
	return dst
}

func encodeImage(img image.Image, format string) ([]byte, error) {
	var buf bytes.Buffer
	var err error
	switch format {
	case "png":
		err = (&png.Encoder{CompressionLevel: png.BestSpeed}).Encode(&buf, img)
	case "gif":
		err = gif.Encode(&buf, img, nil)
	default:
		err = jpeg.Encode(&buf, img, &jpeg.Options{Quality: 85})
	}
	return buf.Bytes(), err
}

func mimeOf(format string) string {
	return "image/" + format
}
