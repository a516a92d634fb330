//go:build tools

// Package tools pins what build.sh needs: the provider's packages, and the schema codegen its
// generate.go runs with.
package tools

import (
	_ "github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/provider"
	_ "github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version"
	_ "github.com/pulumi/pulumi/pkg/v3/codegen/schema"
)
