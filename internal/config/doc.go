// Package config reads the dedupworker binary's YAML configuration:
// strict decoding (unknown fields, wrong types and bad durations
// are errors naming the field path and line), ${ENV} expansion, defaults, and
// validation.
package config
