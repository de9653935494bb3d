package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/app"
	"github.com/idemkit/dedupworker/internal/config"
	"github.com/idemkit/dedupworker/redisbackend"
)

const (
	// redriveCallTimeout bounds each network call: a record read, a forget,
	// a publish, an ack or commit, a fetch.
	redriveCallTimeout = 10 * time.Second
	// redriveAckWait is the ack wait of the NATS redrive durable: a dead
	// letter delivered to a run that died is delivered again after it.
	redriveAckWait = 30 * time.Second
	// redriveFetch is how many dead letters one fetch asks for.
	redriveFetch = 128
	// redriveIdle is how long an empty Kafka fetch waits for a record
	// below the high watermark before the partition is given up for this
	// run.
	redriveIdle = 2 * time.Second
)

// Actions a dead letter gets, as printed and in -o json.
const (
	actRepublished    = "republished"
	actSkipped        = "skipped"
	actFailed         = "failed"
	actWouldRepublish = "would republish"
	actWouldSkip      = "would skip"
	recordAbsent      = "absent"
	recordNoKey       = "no key"
	dlqHeaderPrefix   = "Dedup-Dlq-"
)

// deadLetter is one dead letter read from a source.
type deadLetter struct {
	// ID says where it is: "partition 0 offset 12" or "stream DLQ seq 5".
	ID string
	// Key is the raw idempotency key (Dedup-Dlq-Key), empty when the message
	// had none.
	Key string
	// Origin says where it is republished: the Kafka partition or NATS
	// subject it came from.
	Origin string
	// Payload and Header are the original message: Header without the
	// Dedup-Dlq-* headers.
	Payload []byte
	Header  consumer.Header
	// Reason is the Dedup-Dlq-Reason header.
	Reason string
	// Handler is the Dedup-Dlq-Handler header: the handler that
	// dead-lettered it.
	Handler string

	// handle is the source's own (the NATS message, the Kafka offset).
	handle any
}

// dlqSource reads the dead letters of one handler and sends them back.
type dlqSource interface {
	// describe names the dead-letter source and where messages go back.
	describe() (from, to string)
	// next returns the next dead letter, or nil when there are no more for
	// this run.
	next(ctx context.Context) (*deadLetter, error)
	// republish sends the original message back to the handler's source.
	republish(ctx context.Context, dl *deadLetter) error
	// settle acks or commits dl: its source will not deliver it again.
	settle(ctx context.Context, dl *deadLetter) error
	// leave gives dl back unsettled, for the next run.
	leave(ctx context.Context, dl *deadLetter)
	// notes are what the run should tell the operator (dead letters held
	// by another run, partitions given up).
	notes() []string
	// close gives back what was fetched and not processed, and closes the
	// connections.
	close()
}

// redriveRow is one dead letter's line in the output.
type redriveRow struct {
	DeadLetter string `json:"dead_letter"`
	Key        string `json:"key"`
	Reason     string `json:"reason,omitempty"`
	Record     string `json:"record"`
	Action     string `json:"action"`
	To         string `json:"to,omitempty"`
	Error      string `json:"error,omitempty"`
}

// redriveReport is redrive's -o json shape.
type redriveReport struct {
	Handler     string       `json:"handler"`
	Transport   string       `json:"transport"`
	From        string       `json:"from"`
	To          string       `json:"to"`
	DryRun      bool         `json:"dry_run"`
	Read        int          `json:"read"`
	Republished int          `json:"republished"`
	Skipped     int          `json:"skipped"`
	Failed      int          `json:"failed"`
	Limited     bool         `json:"limit_reached"`
	Notes       []string     `json:"notes,omitempty"`
	DeadLetters []redriveRow `json:"dead_letters"`
}

// cmdRedrive is "dedupworker redrive": it sends a handler's dead letters
// back through the worker. For each dead letter, in the order
// its source delivers them:
//
//  1. it reads the record of the dead letter's key (Dedup-Dlq-Key) and, if
//     it is dead_lettered, deletes it with the state-checked forget_if
//     script, so that a record claimed or completed in between is kept;
//  2. it republishes the original payload and headers, without the
//     Dedup-Dlq-* headers, to the handler's source: on Kafka the handler's
//     topic, with the same key, to the partition it came from
//     (Dedup-Dlq-Partition); on NATS the subject it came from
//     (Dedup-Dlq-Subject);
//  3. it acks (NATS) or commits (Kafka) the dead letter.
//
// A dead letter whose record is completed (processed since, or the record
// of another payload), claimed or released for retry (in flight again: if
// it fails, it is dead-lettered anew) is skipped: nothing is forgotten or
// republished, and the dead letter is acked or committed, since that
// record, not this copy, now decides what happens to the key; leaving it
// would show it to every later run.
//
// A dead letter of another handler (Dedup-Dlq-Handler; handlers may share
// a dead-letter destination) is skipped and acked or committed too: each
// handler reads the destination through a consumer or group of its own,
// so the other handler's redrive still finds it.
//
// A dead letter whose key has no record (absent: expired after its
// retention, deleted by forget, or forgotten by an earlier redrive that
// stopped before it republished) is republished without a forget: no
// worker holds or has completed that key, so running it once more is what
// the record's absence allows, and skipping it would drop the only copy of
// a message that never succeeded. A dead letter without a key
// (missing_key) has no record either and is republished for the same
// reason: the worker decides again with the config it runs now.
//
// What a crash (or a failed call) between the steps leaves:
//
//   - before 1, or 1 not done: nothing changed; a rerun starts again.
//   - after 1, before 2 is done (a failed republish included): the record
//     is gone and the dead letter is still there (not acked, not
//     committed); a rerun finds no record and republishes it.
//   - after 2, before 3: the message is back in the source and the dead
//     letter too; a rerun finds the record claimed or completed by the
//     worker (skipped, then acked or committed) or, if the worker has not
//     reached it yet, absent, and republishes it again: the source then
//     holds it twice and the worker's claim runs it once.
//
// So a dead letter is acked or committed only after its message is back in
// the source, or after its record shows the key was taken up again; and a
// key does not run twice within its retention, since every republished
// copy meets the same claim.
//
// Sources. NATS: the stream that captures the handler's
// dead_letter.nats.subject, read through the durable consumer
// "<source consumer>-redrive" (created on first use, filtered to that
// subject, with an ack wait of redriveAckWait). Dead letters past the stream's last
// sequence at the start are left for the next run, so a dead letter the
// worker publishes while redrive runs is not redriven in a loop. Kafka: the
// dead_letter.kafka.topic, read from every partition between the offset
// committed by the group "<source group>-redrive" (or the first) and the
// high watermark at the start. The group's offsets are committed without
// joining it (generation -1): run one redrive per handler at a time.
//
// --dry-run reads the same dead letters and the records and changes
// nothing: no forget, no publish, no ack or commit. On NATS it reads
// through an ordered consumer from the durable's ack floor, so the durable
// is untouched.
//
// It stops at the first republish that fails, leaving that dead letter
// for the next run (NATS: nak'ed, so it is redelivered at once; Kafka: the
// offset is not committed past it), and exits 1. On NATS a republish the
// source stream drops as a duplicate (its Nats-Msg-Id is still within the
// stream's duplicate window) has not put the message back, so it counts as
// failed too. SIGINT or SIGTERM stops the run between two dead letters.
func cmdRedrive(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("redrive", "redrive -c FILE --handler NAME [--limit N] [--dry-run] [-o table|json]", `  dedupworker redrive -c config.yaml --handler orders --dry-run     # what would go back, changes nothing
  dedupworker redrive -c config.yaml --handler orders               # forget, republish, ack each dead letter
  dedupworker redrive -c config.yaml --handler orders --limit 10 -o json
`, stdout, stderr)
	file := fs.String("c", "", "the config `file`: the handler's source, dead_letter and the redis section (required)")
	handler := fs.String("handler", "", "the handler `name` whose dead letters go back (required)")
	limit := fs.Int("limit", 0, "stop after `N` dead letters (0: all of them)")
	dryRun := fs.Bool("dry-run", false, "show what would be forgotten and republished; change nothing")
	output := fs.String("o", "table", "output `format`: table or json")
	if err := parseInterspersed(fs, args); err != nil {
		return err
	}
	switch {
	case *file == "" || *handler == "" || fs.NArg() != 0:
		fs.Usage()
		return usagef("-c FILE and --handler NAME are required, and redrive takes no arguments")
	case *output != "table" && *output != "json":
		return usagef("-o %q: want table or json", *output)
	case *limit < 0:
		return usagef("--limit %d: want 0 (all) or more", *limit)
	}
	cfg, err := loadConfig(*file)
	if err != nil {
		return err
	}
	idx, h, err := redriveHandler(cfg, *handler, *file)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	octx, cancel := context.WithTimeout(ctx, cfg.Redis.ConnectTimeout.D()+2*time.Second)
	store, closeStore, err := app.OpenStore(octx, &cfg.Redis, slog.New(slog.DiscardHandler))
	cancel()
	if err != nil {
		return err
	}
	defer closeStore()
	src, transport, err := openDLQSource(ctx, idx, h, *dryRun)
	if err != nil {
		return err
	}
	defer src.close()

	rep := redriveReport{Handler: h.Name, Transport: transport, DryRun: *dryRun, DeadLetters: []redriveRow{}}
	rep.From, rep.To = src.describe()
	runErr := redriveAll(ctx, store, src, h.Name, *limit, *dryRun, &rep)
	rep.Notes = src.notes()
	if err := printRedrive(stdout, stderr, *output, &rep); err != nil {
		return err
	}
	switch {
	case runErr != nil:
		return runErr
	case rep.Failed > 0:
		return fmt.Errorf("%d republish failed; its dead letter was left in %s for the next run (nothing is lost)", rep.Failed, rep.From)
	}
	return nil
}

// redriveHandler finds the handler and its dead-letter destination in cfg.
func redriveHandler(cfg *config.Config, name, file string) (int, *config.Handler, error) {
	names := make([]string, len(cfg.Handlers))
	for i := range cfg.Handlers {
		h := &cfg.Handlers[i]
		names[i] = h.Name
		if h.Name != name {
			continue
		}
		if h.DeadLetter == nil || (h.DeadLetter.Kafka == nil && h.DeadLetter.NATS == nil) {
			return 0, nil, usagef("handlers[%d].dead_letter: handler %q has no dead-letter destination, so it has no dead letters to redrive; dead letters need dead_letter: {kafka: {topic: ...}} or {nats: {subject: ...}}", i, name)
		}
		return i, h, nil
	}
	return 0, nil, usagef("--handler %q is not a handler of %s (it has %s)", name, file, strings.Join(names, ", "))
}

// redriveAll runs the three steps for each dead letter of src, up to
// limit (0: all), filling rep, until ctx is done. It stops at the first
// dead letter whose record could not be read or forgotten, or whose
// republish failed (each counted in rep.Failed, and left for the next
// run), and returns an error when a settle failed or a read or forget did.
func redriveAll(ctx context.Context, store *redisbackend.Store, src dlqSource, handler string, limit int, dryRun bool, rep *redriveReport) error {
	for limit == 0 || rep.Read < limit {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("stopped: %w", err)
		}
		dl, err := src.next(ctx)
		if err != nil {
			return err
		}
		if dl == nil {
			return nil
		}
		rep.Read++
		// Once a dead letter's steps begin they run to their end, each
		// within its own deadline: a signal stops the run after them,
		// not between a forget and its republish.
		work := context.WithoutCancel(ctx)
		row := redriveRow{DeadLetter: dl.ID, Key: dl.Key, Reason: dl.Reason, To: dl.Origin}
		republish, err := redriveDecide(work, store, handler, dl, dryRun, &row)
		if err != nil {
			src.leave(work, dl)
			row.Action, row.Error = actFailed, err.Error()
			rep.Failed++
			rep.DeadLetters = append(rep.DeadLetters, row)
			return err
		}
		switch {
		case dryRun && republish:
			row.Action = actWouldRepublish
			rep.Republished++
		case dryRun:
			row.Action = actWouldSkip
			rep.Skipped++
		case republish:
			if err := src.republish(work, dl); err != nil {
				src.leave(work, dl)
				row.Action, row.Error = actFailed, err.Error()
				rep.Failed++
				rep.DeadLetters = append(rep.DeadLetters, row)
				return nil
			}
			row.Action = actRepublished
			rep.Republished++
		default:
			row.Action = actSkipped
			rep.Skipped++
		}
		rep.DeadLetters = append(rep.DeadLetters, row)
		if dryRun {
			continue
		}
		if err := src.settle(work, dl); err != nil {
			row := &rep.DeadLetters[len(rep.DeadLetters)-1]
			row.Error = "settling the dead letter: " + err.Error()
			return fmt.Errorf("%s was %s but settling its dead letter failed (a rerun reads it again and finds the record taken up or absent): %w", dl.ID, row.Action, err)
		}
	}
	rep.Limited = true
	return nil
}

// redriveDecide reads dl's record into row.Record and reports whether dl
// goes back to the source; unless dryRun, a dead_lettered record is
// forgotten first (state-checked: if it changed since the read, it is
// kept and dl is skipped).
func redriveDecide(ctx context.Context, store *redisbackend.Store, handler string, dl *deadLetter, dryRun bool, row *redriveRow) (bool, error) {
	if dl.Handler != "" && dl.Handler != handler {
		// Handlers may share a dead-letter destination; each reads it
		// through a consumer or group of its own, so this one passes
		// over another's dead letter and that handler's redrive takes it.
		row.Record = "of handler " + dl.Handler
		return false, nil
	}
	if dl.Key == "" {
		row.Record = recordNoKey
		return true, nil
	}
	ekey := idempotency.EffectiveKey(handler, dl.Key)
	cctx, cancel := context.WithTimeout(ctx, redriveCallTimeout)
	defer cancel()
	rec, err := store.Get(cctx, ekey)
	if err != nil {
		return false, fmt.Errorf("reading the record of %q: %w", dl.Key, err)
	}
	if rec == nil {
		row.Record = recordAbsent
		return true, nil
	}
	class := redisbackend.ClassOf(rec)
	row.Record = string(class)
	if class != redisbackend.ClassDeadLettered {
		return false, nil
	}
	if dryRun {
		return true, nil
	}
	r, err := store.ForgetIf(cctx, []string{ekey}, redisbackend.ClassDeadLettered, 0)
	if err != nil {
		return false, fmt.Errorf("forgetting the record of %q: %w", dl.Key, err)
	}
	switch {
	case r.Deleted == 1:
		return true, nil
	case r.Gone == 1: // expired or deleted since the read: absent, as above
		row.Record = recordAbsent
		return true, nil
	default: // claimed or completed since the read: kept, and dl skipped
		if rec, err := store.Get(cctx, ekey); err == nil && rec != nil {
			row.Record = string(redisbackend.ClassOf(rec))
		}
		return false, nil
	}
}

// isDLQHeader reports whether name is one of the Dedup-Dlq-* headers
// (consumer.HeaderDeadLetter*), in any case.
func isDLQHeader(name string) bool {
	return len(name) >= len(dlqHeaderPrefix) && strings.EqualFold(name[:len(dlqHeaderPrefix)], dlqHeaderPrefix)
}

// stripDLQHeaders returns h without the Dedup-Dlq-* headers the worker
// added when it dead-lettered the message.
func stripDLQHeaders(h consumer.Header) consumer.Header {
	out := make(consumer.Header, len(h))
	for k, v := range h {
		if !isDLQHeader(k) {
			out[k] = v
		}
	}
	return out
}

func printRedrive(stdout, stderr io.Writer, output string, rep *redriveReport) error {
	if output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	if len(rep.DeadLetters) > 0 {
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "DEAD LETTER\tKEY\tREASON\tRECORD\tACTION\tTO")
		for _, r := range rep.DeadLetters {
			action := r.Action
			if r.Error != "" {
				action += ": " + r.Error
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.DeadLetter, orDash(r.Key), orDash(r.Reason), r.Record, action, r.To)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(stderr, "note: %s\n", n)
	}
	verb, skip := "republished", "skipped"
	if rep.DryRun {
		verb, skip = "dry run: would republish", "would skip"
	}
	more := ""
	if rep.Limited {
		more = " (--limit reached; there may be more)"
	}
	fmt.Fprintf(stdout, "%s %d, %s %d (record taken up again, or another handler's), failed %d; %d dead letters read from %s%s\n",
		verb, rep.Republished, skip, rep.Skipped, rep.Failed, rep.Read, rep.From, more)
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// openDLQSource opens the dead-letter source of handler h (handlers[idx]).
func openDLQSource(ctx context.Context, idx int, h *config.Handler, dryRun bool) (dlqSource, string, error) {
	switch {
	case h.Source.Kafka != nil && h.DeadLetter.Kafka != nil:
		s, err := openKafkaDLQ(ctx, idx, h)
		return s, "kafka", err
	case h.Source.NATS != nil && h.DeadLetter.NATS != nil:
		s, err := openNATSDLQ(ctx, idx, h, dryRun)
		return s, "nats", err
	}
	return nil, "", usagef("handlers[%d].dead_letter: its transport must be the source's (config validation says so)", idx)
}
