package node

import (
	"fmt"
	"io"
	"log/slog"
)

// NewLogger builds the agent's logger writing to w: level is "debug",
// "info", "warn" or "error" (empty: info), format "text" (logfmt-style
// key=value lines) or "json" (one object per line, for log shippers; empty:
// text). Config.LogLevel and Config.LogFormat carry them from the config
// file.
func NewLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	l, err := logLevel(level)
	if err != nil {
		return nil, err
	}
	return NewLevelLogger(w, l, format)
}

// NewLevelLogger is NewLogger at a level that may change while it logs
// (a *slog.LevelVar from LogLevelVar, which tribe reload sets).
func NewLevelLogger(w io.Writer, level slog.Leveler, format string) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "", "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: use text or json", format)
}

func logLevel(s string) (slog.Level, error) {
	switch s {
	case "debug":
		return slog.LevelDebug, nil
	case "", "info":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("log level %q: use debug, info, warn or error", s)
}
