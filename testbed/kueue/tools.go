//go:build tools

// Package tools pins the Kueue command the test bed builds.
package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"
