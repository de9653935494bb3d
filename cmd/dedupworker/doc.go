// Command dedupworker runs effectively-once workers over Kafka and NATS
// JetStream from a YAML configuration.
//
//	dedupworker run -c config.yaml        run the handlers of a config
//	dedupworker demo                      see it work, with nothing installed
//	dedupworker validate -c config.yaml   check a config (--print, --strict, --online)
//	dedupworker setup -c config.yaml      create the streams or topics it names, if missing
//	dedupworker publish -c config.yaml --handler orders --key order-1 '{"id":"order-1"}'
//	dedupworker inspect -c config.yaml --handler orders KEY
//	dedupworker forget  -c config.yaml --handler orders KEY --yes
//	dedupworker records -c config.yaml --handler orders --state claimed --older-than 10m
//	dedupworker forget  -c config.yaml --handler orders --state dead_lettered --dry-run
//	dedupworker redrive -c config.yaml --handler orders --dry-run
//	dedupworker stats   -c config.yaml --rate 500/s
//	dedupworker version
//
// Exit codes: 0 ok (also after SIGTERM/SIGINT and a clean drain), 1 runtime
// failure, 2 bad usage or configuration.
package main
