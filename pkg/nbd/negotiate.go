package nbd

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"
)

// maxOptionLength bounds the data of one option that is read into memory.
const maxOptionLength = 64 << 10

// errAborted ends a negotiation the client aborted.
var errAborted = errors.New("nbd: client aborted negotiation")

// negotiate runs the fixed-newstyle handshake on c until the client picks an export (c.exp
// is set and nil is returned) or the negotiation ends.
func (c *conn) negotiate() error {
	if err := c.nc.SetDeadline(time.Now().Add(c.srv.opts.NegotiationTimeout)); err != nil {
		return err
	}
	if err := c.options(); err != nil {
		return err
	}
	// Clear the deadline, then look at draining: a drain that raced with the clearing is
	// seen here, one that comes later sets its own deadline.
	if err := c.nc.SetDeadline(time.Time{}); err != nil {
		return err
	}
	if c.draining.Load() {
		return errDrained
	}
	return nil
}

// options runs the handshake proper.
func (c *conn) options() error {
	// The reader is kept for the transmission phase: it may already hold a request.
	c.br = bufio.NewReaderSize(c.nc, readBufferSize)
	br := c.br
	bw := bufio.NewWriterSize(c.nc, 4096)
	var hdr [20]byte
	binary.BigEndian.PutUint64(hdr[0:], magicNBD)
	binary.BigEndian.PutUint64(hdr[8:], magicOption)
	binary.BigEndian.PutUint16(hdr[16:], uint16(FlagFixedNewstyle|FlagNoZeroes))
	if _, err := bw.Write(hdr[:18]); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if _, err := io.ReadFull(br, hdr[:4]); err != nil {
		return err
	}
	clientFlags := binary.BigEndian.Uint32(hdr[:4])
	if clientFlags&^uint32(FlagFixedNewstyle|FlagNoZeroes) != 0 {
		return fmt.Errorf("%w: unknown client flags %#x", ErrProtocol, clientFlags)
	}
	noZeroes := clientFlags&uint32(FlagNoZeroes) != 0

	var data []byte
	for {
		if _, err := io.ReadFull(br, hdr[:16]); err != nil {
			return err
		}
		if m := binary.BigEndian.Uint64(hdr[0:]); m != magicOption {
			return fmt.Errorf("%w: bad option magic %#x", ErrProtocol, m)
		}
		id := OptionID(binary.BigEndian.Uint32(hdr[8:]))
		length := binary.BigEndian.Uint32(hdr[12:])
		if length > maxOptionLength {
			if _, err := io.CopyN(io.Discard, br, int64(length)); err != nil {
				return err
			}
			if err := c.optReply(bw, id, RepErrTooBig, nil); err != nil {
				return err
			}
			continue
		}
		if cap(data) < int(length) {
			data = make([]byte, length)
		}
		data = data[:length]
		if _, err := io.ReadFull(br, data); err != nil {
			return err
		}
		switch id {
		case OptExportName:
			x, ok := c.srv.exports[string(data)]
			if !ok {
				return fmt.Errorf("%w: %q", ErrUnknownExport, data)
			}
			var b [10 + 124]byte
			binary.BigEndian.PutUint64(b[0:], uint64(x.size()))
			binary.BigEndian.PutUint16(b[8:], uint16(x.flags))
			n := len(b)
			if noZeroes {
				n = 10
			}
			if _, err := bw.Write(b[:n]); err != nil {
				return err
			}
			if err := bw.Flush(); err != nil {
				return err
			}
			c.exp = x
			return nil
		case OptAbort:
			// The client may close without reading the ACK; an error writing it is moot.
			_ = c.optReply(bw, id, RepAck, nil)
			return errAborted
		case OptList:
			if length != 0 {
				if err := c.optReply(bw, id, RepErrInvalid, nil); err != nil {
					return err
				}
				continue
			}
			for _, x := range c.srv.exports {
				b := make([]byte, 4, 4+len(x.Name))
				binary.BigEndian.PutUint32(b, uint32(len(x.Name)))
				b = append(b, x.Name...)
				if err := c.optReply(bw, id, RepServer, b); err != nil {
					return err
				}
			}
			if err := c.optReply(bw, id, RepAck, nil); err != nil {
				return err
			}
		case OptInfo, OptGo:
			done, err := c.optInfo(bw, id, data)
			if err != nil || done {
				return err
			}
		default:
			if err := c.optReply(bw, id, RepErrUnsup, nil); err != nil {
				return err
			}
		}
	}
}

// optInfo answers OPT_INFO and OPT_GO. It reports done when OPT_GO succeeded and the
// transmission phase starts.
func (c *conn) optInfo(bw *bufio.Writer, id OptionID, data []byte) (done bool, err error) {
	if len(data) < 6 {
		return false, c.optReply(bw, id, RepErrInvalid, nil)
	}
	nameLen := binary.BigEndian.Uint32(data)
	if uint64(nameLen)+6 > uint64(len(data)) {
		return false, c.optReply(bw, id, RepErrInvalid, nil)
	}
	name := data[4 : 4+nameLen]
	rest := data[4+nameLen:]
	nReq := int(binary.BigEndian.Uint16(rest))
	reqs := rest[2:]
	if len(reqs) != 2*nReq {
		return false, c.optReply(bw, id, RepErrInvalid, nil)
	}
	x, ok := c.srv.exports[string(name)]
	if !ok {
		return false, c.optReply(bw, id, RepErrUnknown, nil)
	}
	var b [18]byte
	binary.BigEndian.PutUint16(b[0:], uint16(InfoExport))
	binary.BigEndian.PutUint64(b[2:], uint64(x.size()))
	binary.BigEndian.PutUint16(b[10:], uint16(x.flags))
	if err := c.optReply(bw, id, RepInfo, b[:12]); err != nil {
		return false, err
	}
	binary.BigEndian.PutUint16(b[0:], uint16(InfoBlockSize))
	binary.BigEndian.PutUint32(b[2:], uint32(c.srv.opts.MinBlockSize))
	binary.BigEndian.PutUint32(b[6:], uint32(c.srv.opts.BlockSize))
	binary.BigEndian.PutUint32(b[10:], uint32(c.srv.opts.MaxRequestSize))
	if err := c.optReply(bw, id, RepInfo, b[:14]); err != nil {
		return false, err
	}
	for i := 0; i < nReq; i++ {
		var text string
		t := InfoType(binary.BigEndian.Uint16(reqs[2*i:]))
		switch t {
		case InfoName:
			text = x.Name
		case InfoDescription:
			text = x.Description
		default:
			continue
		}
		p := make([]byte, 2, 2+len(text))
		binary.BigEndian.PutUint16(p, uint16(t))
		p = append(p, text...)
		if err := c.optReply(bw, id, RepInfo, p); err != nil {
			return false, err
		}
	}
	if err := c.optReply(bw, id, RepAck, nil); err != nil {
		return false, err
	}
	if id == OptGo {
		c.exp = x
		return true, nil
	}
	return false, nil
}

func (c *conn) optReply(bw *bufio.Writer, id OptionID, typ ReplyType, data []byte) error {
	var h [20]byte
	binary.BigEndian.PutUint64(h[0:], magicOptionReply)
	binary.BigEndian.PutUint32(h[8:], uint32(id))
	binary.BigEndian.PutUint32(h[12:], uint32(typ))
	binary.BigEndian.PutUint32(h[16:], uint32(len(data)))
	if _, err := bw.Write(h[:]); err != nil {
		return err
	}
	if _, err := bw.Write(data); err != nil {
		return err
	}
	return bw.Flush()
}

// isClosed reports errors that only say the peer or Shutdown ended the connection.
func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, errDrained)
}
