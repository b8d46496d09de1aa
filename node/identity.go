package node

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/keys"
)

// Identity returns the peer ID of the node whose data dir is dataDir,
// making the data dir and its identity key if they do not exist, without
// starting a node: how an operator learns a host's peer ID before its
// first start, to admit it (tribe admit PEERID --name N) or to name it a
// trusted writer. created says whether the key was made now. A key is
// made only under the data dir's lock, so an agent starting at the same
// moment cannot make another; reading one needs no lock, so a running
// agent's ID is read too.
func Identity(dataDir string) (id peer.ID, created bool, err error) {
	// A key in a dir others can write may be theirs: an ID admitted ahead
	// from it would admit them. The agent refuses such a dir too.
	if err := prepareDataDir(dataDir); err != nil {
		return "", false, err
	}
	path := filepath.Join(dataDir, keys.IdentityFile)
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		lock, err := lockDataDir(dataDir)
		if err != nil {
			return "", false, err
		}
		defer lock.Close()
	}
	key, created, err := keys.LoadOrCreateIdentity(path)
	if err != nil {
		return "", false, err
	}
	if id, err = peer.IDFromPrivateKey(key); err != nil {
		return "", false, fmt.Errorf("node: identity %s: %w", path, err)
	}
	return id, created, nil
}
