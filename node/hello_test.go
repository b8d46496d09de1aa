package node

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestHelloRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	want := hello{Name: "web-1", Cluster: "prod", Version: "1.2.3"}
	if err := writeHello(&buf, want); err != nil {
		t.Fatal(err)
	}
	got, err := readHello(&buf)
	if err != nil || got != want {
		t.Fatalf("got %+v, %v", got, err)
	}
}

func TestReadHelloRefusesBadInput(t *testing.T) {
	cases := map[string]string{
		"not json":       "hello\n",
		"no newline":     `{"name":"a","cluster":"c"}`,
		"bad cluster":    `{"name":"a","cluster":"Bad Cluster"}` + "\n",
		"unknown field":  `{"name":"a","cluster":"c","x":1}` + "\n",
		"trailing data":  `{"name":"a","cluster":"c"}` + "\nmore",
		"oversized":      `{"name":"` + strings.Repeat("a", maxHelloSize) + `","cluster":"c"}` + "\n",
		"long name":      `{"name":"` + strings.Repeat("a", 65) + `","cluster":"c"}` + "\n",
		"two objects":    `{"cluster":"c"}{"cluster":"c"}` + "\n",
		"empty":          "",
		"only a newline": "\n",
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := readHello(strings.NewReader(in)); !errors.Is(err, ErrBadHello) {
				t.Fatalf("err = %v, want ErrBadHello", err)
			}
		})
	}
}

// FuzzReadHello feeds arbitrary bytes from the network to the hello
// decoder: it must never panic, and whatever it accepts must be valid and
// survive a round trip.
func FuzzReadHello(f *testing.F) {
	f.Add([]byte(`{"name":"a","cluster":"tribe","version":"1"}` + "\n"))
	f.Add([]byte("\n"))
	f.Add([]byte(`{"cluster":"x"}` + "\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := readHello(bytes.NewReader(b))
		if err != nil {
			return
		}
		if !clusterRE.MatchString(h.Cluster) || len(h.Name) > 64 {
			t.Fatalf("accepted an invalid hello %+v", h)
		}
		var buf bytes.Buffer
		writeHello(&buf, h)
		again, err := readHello(&buf)
		if err != nil || again != h {
			t.Fatalf("round trip of %+v: %+v, %v", h, again, err)
		}
	})
}
