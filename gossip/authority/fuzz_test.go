package authority

import (
	"encoding/json"
	"errors"
	"testing"
)

// Admission values and plugin grants come from the network (signed by a
// trusted writer, but a writer's bug or a future version may put anything
// there): decoding never panics, and what decodes is one of the known
// states or grants.
func FuzzDecodeAdmission(f *testing.F) {
	for _, s := range []string{`{"state":"admitted","name":"a"}`, `{"state":"revoked"}`, `{}`, `null`, `[]`, `{"state":1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := DecodeAdmission(b)
		if err != nil {
			if !errors.Is(err, ErrBadAdmission) {
				t.Fatalf("error %v is not ErrBadAdmission", err)
			}
			return
		}
		if a.State != Admitted && a.State != Revoked {
			t.Fatalf("decoded state %q", a.State)
		}
	})
}

func FuzzGrant(f *testing.F) {
	for _, s := range []string{`["members"]`, `["tribe:ops","admitted"]`, `["tribe:"]`, `[""]`, `["tribe:a/b"]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var g Grant
		if json.Unmarshal(b, &g) != nil || g.Check() != nil {
			return
		}
		for _, tr := range g.Tribes("own") {
			if tr == "" {
				t.Fatalf("grant %q names an empty tribe", g)
			}
		}
	})
}
