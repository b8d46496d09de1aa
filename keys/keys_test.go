package keys

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
)

func TestIdentityCreateThenReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", IdentityFile)
	k1, created, err := LoadOrCreateIdentity(path)
	if err != nil || !created {
		t.Fatalf("first load: created=%v err=%v", created, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode = %04o, want 0600", st.Mode().Perm())
	}
	if k1.Type() != crypto.Ed25519 {
		t.Fatalf("key type = %v", k1.Type())
	}
	k2, created, err := LoadOrCreateIdentity(path)
	if err != nil || created {
		t.Fatalf("reload: created=%v err=%v", created, err)
	}
	if !k1.Equals(k2) {
		t.Fatal("reloaded key differs from the created one")
	}
	leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".tmp-*"))
	if len(leftovers) != 0 {
		t.Fatalf("temporary files left behind: %v", leftovers)
	}
}

func TestIdentityRefusesBadFiles(t *testing.T) {
	rsa, _, err := crypto.GenerateECDSAKeyPair(nil)
	if err != nil {
		t.Fatal(err)
	}
	ecdsaBytes, err := crypto.MarshalPrivateKey(rsa)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		setup   func(path string)
		wantErr error
		wantMsg string
	}{
		{"world readable", func(p string) {
			LoadOrCreateIdentity(p)
			os.Chmod(p, 0o644)
		}, ErrInsecureFile, "chmod 600"},
		{"group readable", func(p string) {
			LoadOrCreateIdentity(p)
			os.Chmod(p, 0o640)
		}, ErrInsecureFile, "mode 0640"},
		{"corrupt", func(p string) {
			os.WriteFile(p, []byte("not a key at all"), 0o600)
		}, ErrCorrupt, "move it aside"},
		{"empty", func(p string) {
			os.WriteFile(p, nil, 0o600)
		}, ErrCorrupt, "move it aside"},
		{"wrong key type", func(p string) {
			os.WriteFile(p, ecdsaBytes, 0o600)
		}, ErrCorrupt, "ed25519"},
		{"unreadable (a directory)", func(p string) {
			os.Mkdir(p, 0o700)
		}, nil, "cannot read"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), IdentityFile)
			tc.setup(path)
			before, _ := os.ReadFile(path)
			_, _, err := LoadOrCreateIdentity(path)
			if err == nil {
				t.Fatal("expected an error")
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("message %q should name %s and say %q", err, path, tc.wantMsg)
			}
			after, _ := os.ReadFile(path)
			if string(before) != string(after) {
				t.Fatal("a refused key file was modified")
			}
		})
	}
}

func TestSwarmKey(t *testing.T) {
	dir := t.TempDir()
	var k [32]byte
	for i := range k {
		k[i] = byte(i)
	}
	good := filepath.Join(dir, "swarm.key")
	if err := os.WriteFile(good, FormatSwarmKey(k), 0o600); err != nil {
		t.Fatal(err)
	}
	psk, err := LoadSwarmKey(good)
	if err != nil {
		t.Fatal(err)
	}
	if string(psk) != string(k[:]) {
		t.Fatal("decoded swarm key differs")
	}

	bad := filepath.Join(dir, "bad.key")
	os.WriteFile(bad, []byte("/key/swarm/psk/1.0.0/\n/base16/\nzz\n"), 0o600)
	if _, err := LoadSwarmKey(bad); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("bad key: err = %v", err)
	}
	open := filepath.Join(dir, "open.key")
	os.WriteFile(open, FormatSwarmKey(k), 0o644)
	os.Chmod(open, 0o644)
	if _, err := LoadSwarmKey(open); !errors.Is(err, ErrInsecureFile) {
		t.Fatalf("open key: err = %v", err)
	}
	if _, err := LoadSwarmKey(filepath.Join(dir, "missing.key")); err == nil {
		t.Fatal("missing key: no error")
	}
}
