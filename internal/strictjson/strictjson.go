// Package strictjson decodes one JSON value from bytes that came from the
// network: fields the value's type does not have are refused, and so is
// anything after the value but JSON's white space.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
)

// ErrTrailing is the error of bytes with more than white space after the
// value.
var ErrTrailing = errors.New("data after the JSON value")

// Decode decodes b, one JSON value, into v. json.Decoder alone stops at
// the value's end and leaves the rest unread, and its More says nothing
// more is there when a '}' or ']' follows: both let trailing data through.
func Decode(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if len(bytes.Trim(b[d.InputOffset():], " \t\r\n")) > 0 {
		return ErrTrailing
	}
	return nil
}
