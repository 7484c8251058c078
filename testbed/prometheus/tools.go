//go:build tools

// Package tools pins the Prometheus server command the test bed builds.
package tools

import _ "github.com/prometheus/prometheus/cmd/prometheus"
