package jsonerr

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestPlainWords(t *testing.T) {
	type args struct {
		Command string   `json:"command"`
		Argv    []string `json:"argv"`
		Count   int      `json:"count"`
		Opts    struct {
			Deep bool `json:"deep"`
		} `json:"opts"`
	}
	cases := []struct{ in, want string }{
		{`{"command": 1}`, `field "command": want text, got a number`},
		{`{"argv": "ls"}`, `field "argv": want a list of text, got text`},
		{`{"count": 1.5}`, `field "count": want a whole number, got the number 1.5`},
		{`{"opts": {"deep": "yes"}}`, `field "opts.deep": want true or false, got text`},
		{`[1]`, `want an object, got a list`},
		{`{"bogus": 1}`, `unknown field "bogus"`},
		{`{"command": }`, `not valid JSON at byte 13: invalid character '}' looking for beginning of value`},
		{`{"command": "x"`, `not valid JSON: it ends too early`},
		{``, `no JSON given`},
	}
	for _, tc := range cases {
		var a args
		dec := json.NewDecoder(strings.NewReader(tc.in))
		dec.DisallowUnknownFields()
		err := Plain(dec.Decode(&a))
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s: got %v, want %q", tc.in, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), "Go ") {
			t.Errorf("%s: %q names Go", tc.in, err)
		}
	}
	var typeErr *json.UnmarshalTypeError
	if err := Plain(json.Unmarshal([]byte(`1`), new(string))); !errors.As(err, &typeErr) {
		t.Errorf("Plain hides the json error type: %v", err)
	}
	if Plain(nil) != nil {
		t.Error("Plain(nil) != nil")
	}
}
