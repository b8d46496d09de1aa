package strictjson

import (
	"errors"
	"testing"
)

func TestDecode(t *testing.T) {
	type v struct {
		A int `json:"a"`
	}
	for _, c := range []struct {
		in       string
		ok       bool
		trailing bool
	}{
		{`{"a":1}`, true, false},
		{" {\"a\":1} \r\n\t", true, false},
		{`{"a":1}}`, false, true},
		{`{"a":1}]`, false, true},
		{`{"a":1}{"a":2}`, false, true},
		{`{"a":1} x`, false, true},
		{"{\"a\":1}\u00a0", false, true}, // not JSON's white space
		{`{"a":1,"b":2}`, false, false},  // an unknown field
		{`{"a":`, false, false},
		{``, false, false},
	} {
		var got v
		err := Decode([]byte(c.in), &got)
		if (err == nil) != c.ok || errors.Is(err, ErrTrailing) != c.trailing {
			t.Errorf("%q: %v", c.in, err)
		}
		if c.ok && got.A != 1 {
			t.Errorf("%q: decoded %+v", c.in, got)
		}
	}
}
