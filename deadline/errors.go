package deadline

import "strings"

// joinedError is several errors as one, like errors.Join's, but on one line: an error
// string ends up in a log line or an HTTP body, where a line break would split it or
// forge a record. Its message is the errors' messages separated by "; ", and it unwraps
// to all of them, so errors.Is and errors.As find any.
type joinedError struct{ errs []error }

// join returns the non-nil errs as one error, nil when there is none, and the error
// itself when there is one.
func join(errs ...error) error {
	var kept []error
	for _, err := range errs {
		if err != nil {
			kept = append(kept, err)
		}
	}
	switch len(kept) {
	case 0:
		return nil
	case 1:
		return kept[0]
	}
	return &joinedError{kept}
}

func (e *joinedError) Error() string {
	var b strings.Builder
	for i, err := range e.errs {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(message(err))
	}
	return b.String()
}

// Unwrap returns the errors joined.
func (e *joinedError) Unwrap() []error { return e.errs }

// message returns err's message on one line: each line break (errors.Join puts one
// between the errors it joins) becomes "; ".
func message(err error) string {
	s := err.Error()
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	s = strings.ReplaceAll(s, "\r\n", "\n")
	s = strings.ReplaceAll(s, "\r", "\n")
	return strings.ReplaceAll(s, "\n", "; ")
}
