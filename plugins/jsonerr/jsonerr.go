// Package jsonerr words encoding/json's decoding errors for whoever sent the
// JSON: a caller of a plugin or of the local API sees `field "command": want
// text, got a number`, not Go's `cannot unmarshal number into Go struct field
// .command of type string`.
//
// Wrap every error a JSON decoder returns for input from outside with Plain.
package jsonerr

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
)

// Plain rewords err when it is a JSON decoding error and returns any other
// error unchanged; nil stays nil. The result wraps err, so errors.As still
// finds the json error types.
func Plain(err error) error {
	if err == nil {
		return nil
	}
	return plainError{err}
}

type plainError struct{ err error }

func (e plainError) Unwrap() error { return e.err }

func (e plainError) Error() string {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(e.err, &typeErr):
		msg := fmt.Sprintf("want %s, got %s", typeWords(typeErr.Type), valueWords(typeErr.Value))
		if typeErr.Field != "" {
			return fmt.Sprintf("field %q: %s", typeErr.Field, msg)
		}
		return msg
	case errors.As(e.err, &syntaxErr):
		return fmt.Sprintf("not valid JSON at byte %d: %s", syntaxErr.Offset, strings.TrimPrefix(syntaxErr.Error(), "json: "))
	case errors.Is(e.err, io.EOF):
		return "no JSON given"
	case errors.Is(e.err, io.ErrUnexpectedEOF):
		return "not valid JSON: it ends too early"
	}
	return strings.TrimPrefix(e.err.Error(), "json: ")
}

// typeWords says what JSON a Go type takes.
func typeWords(t reflect.Type) string {
	if t == nil {
		return "another kind of value"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return typeWords(t.Elem())
	case reflect.String:
		return "text"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Interface {
			return "a list"
		}
		return "a list of " + strings.TrimPrefix(strings.TrimPrefix(typeWords(t.Elem()), "a "), "an ")
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "another kind of value"
}

// valueWords says what JSON was given, from UnmarshalTypeError.Value:
// "string", "number", "number 1.5", "bool", "array" or "object".
func valueWords(v string) string {
	switch {
	case v == "string":
		return "text"
	case v == "bool":
		return "true or false"
	case v == "array":
		return "a list"
	case v == "object":
		return "an object"
	case v == "number":
		return "a number"
	case strings.HasPrefix(v, "number "):
		return "the number " + strings.TrimPrefix(v, "number ")
	}
	return v
}
