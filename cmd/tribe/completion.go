package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"
)

// completeFlag is the flag urfave/cli answers with the words that may follow
// (EnableBashCompletion); the bash and zsh scripts ask the binary with it, so
// completion always matches the installed version.
const completeFlag = "--generate-bash-completion"

// The bash script needs no bash-completion package: it asks tribe for the
// words that may follow what is typed so far.
const bashCompletion = `# bash completion for tribe: source it, or save it as
# /etc/bash_completion.d/tribe (or ~/.local/share/bash-completion/completions/tribe)
_tribe_complete() {
  local cur="${COMP_WORDS[COMP_CWORD]}" opts
  local words=("${COMP_WORDS[@]:0:COMP_CWORD}")
  if [[ "$cur" == -* ]]; then
    opts=$("${words[0]}" "${words[@]:1}" "$cur" ` + completeFlag + ` 2>/dev/null)
  else
    opts=$("${words[0]}" "${words[@]:1}" ` + completeFlag + ` 2>/dev/null)
  fi
  COMPREPLY=($(compgen -W "$opts" -- "$cur"))
}
complete -o bashdefault -o default -F _tribe_complete tribe
`

const zshCompletion = `#compdef tribe
# zsh completion for tribe: save it as _tribe in a directory of $fpath,
# or source it after compinit
_tribe() {
  local -a opts
  local cur=${words[-1]}
  if [[ "$cur" == -* ]]; then
    opts=("${(@f)$(${words[@]:0:#words[@]-1} ${cur} ` + completeFlag + ` 2>/dev/null)}")
  else
    opts=("${(@f)$(${words[@]:0:#words[@]-1} ` + completeFlag + ` 2>/dev/null)}")
  fi
  if [[ "${opts[1]}" != "" ]]; then
    _describe 'values' opts
  else
    _files
  fi
}
if [[ "$funcstack[1]" == "_tribe" ]]; then
  _tribe "$@"
else
  compdef _tribe tribe
fi
`

func completionCommand() *cli.Command {
	return &cli.Command{
		Name:      "completion",
		Usage:     "print a shell completion script: bash, zsh or fish",
		ArgsUsage: "bash|zsh|fish",
		Description: `Load it in the current shell, or install it:
   source <(tribe completion bash)
   tribe completion zsh > "${fpath[1]}/_tribe"
   tribe completion fish > ~/.config/fish/completions/tribe.fish`,
		Action: func(c *cli.Context) error {
			shell, err := oneArg(c, "the shell (bash, zsh or fish)")
			if err != nil {
				return err
			}
			return writeCompletion(c.App, shell, c.App.Writer)
		},
	}
}

func writeCompletion(app *cli.App, shell string, w io.Writer) error {
	var script string
	switch shell {
	case "bash":
		script = bashCompletion
	case "zsh":
		script = zshCompletion
	case "fish":
		s, err := app.ToFishCompletion()
		if err != nil {
			return fmt.Errorf("fish completion: %w", err)
		}
		script = s
	default:
		return usagef("completion: unknown shell %q; use bash, zsh or fish", shell)
	}
	_, err := io.WriteString(w, strings.TrimLeft(script, "\n"))
	return err
}
