// Package keys owns the secrets a tribe node holds on disk: its ed25519
// identity key (which is its libp2p peer ID and signs its state entries) and
// the optional swarm key (a libp2p pnet pre-shared key that keeps outsiders
// from even connecting).
//
// Drive it with LoadOrCreateIdentity(path) at start-up and LoadSwarmKey(path)
// when the operator names a swarm key file. Both refuse files that group or
// others can read, and say which file is wrong and what to do about it.
package keys

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/pnet"
)

// IdentityFile is the identity key's file name inside the data dir.
const IdentityFile = "identity.key"

var (
	// ErrInsecureFile is returned for a secret readable by group or others.
	ErrInsecureFile = errors.New("keys: file is readable by group or others")
	// ErrCorrupt is returned for a key file whose bytes are not a key.
	ErrCorrupt = errors.New("keys: file does not hold a valid key")
)

// LoadOrCreateIdentity returns the ed25519 identity key stored at path,
// creating it (mode 0600, written atomically) when no file exists. created
// tells whether a new identity was made. An existing file that is unreadable,
// corrupt, not ed25519 or readable by group/others is an error: the node must
// not silently take on a new peer ID.
func LoadOrCreateIdentity(path string) (key crypto.PrivKey, created bool, err error) {
	raw, err := readSecret(path)
	if errors.Is(err, fs.ErrNotExist) {
		key, _, err = crypto.GenerateEd25519Key(nil)
		if err != nil {
			return nil, false, fmt.Errorf("keys: generate identity: %w", err)
		}
		raw, err = crypto.MarshalPrivateKey(key)
		if err != nil {
			return nil, false, fmt.Errorf("keys: encode identity: %w", err)
		}
		if err := writeSecret(path, raw); err != nil {
			return nil, false, err
		}
		return key, true, nil
	}
	if err != nil {
		return nil, false, err
	}
	key, err = crypto.UnmarshalPrivateKey(raw)
	if err != nil {
		return nil, false, fmt.Errorf("%w: %s: %v; move it aside to start with a new identity (the node gets a new peer ID)", ErrCorrupt, path, err)
	}
	if key.Type() != crypto.Ed25519 {
		return nil, false, fmt.Errorf("%w: %s holds a %s key, tribe uses ed25519; move it aside to start with a new identity", ErrCorrupt, path, key.Type())
	}
	return key, false, nil
}

// LoadSwarmKey reads a libp2p pre-shared swarm key in the usual
// "/key/swarm/psk/1.0.0/" format (as written by ipfs-swarm-key-gen, or by
// FormatSwarmKey). Every node of a private fleet must hold the same key.
func LoadSwarmKey(path string) (pnet.PSK, error) {
	raw, err := readSecret(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("keys: swarm key %s does not exist", path)
	}
	if err != nil {
		return nil, err
	}
	psk, err := pnet.DecodeV1PSK(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%w: %s is not a swarm key: %v", ErrCorrupt, path, err)
	}
	return psk, nil
}

// FormatSwarmKey encodes a 32-byte key in the format LoadSwarmKey reads.
func FormatSwarmKey(key [32]byte) []byte {
	return fmt.Appendf(nil, "/key/swarm/psk/1.0.0/\n/base16/\n%x\n", key[:])
}

// readSecret reads a secret file after checking that only its owner can
// read it. A missing file is reported as fs.ErrNotExist, unwrapped by
// callers with errors.Is.
func readSecret(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		return nil, fmt.Errorf("keys: cannot read %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("keys: cannot read %s: not a regular file", path)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%w: %s has mode %04o; run `chmod 600 %s`", ErrInsecureFile, path, perm, path)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("keys: cannot read %s: %w", path, err)
	}
	return raw, nil
}

// writeSecret writes data to path with mode 0600 through a temporary file
// and a rename, so a crash never leaves a half-written key behind.
func writeSecret(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("keys: create %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return fmt.Errorf("keys: write %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op once renamed
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("keys: write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("keys: write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("keys: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("keys: write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("keys: write %s: %w", path, err)
	}
	return nil
}
