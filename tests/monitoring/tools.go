//go:build tools

// Package tools pins the program this module exists to build; it is never compiled.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
