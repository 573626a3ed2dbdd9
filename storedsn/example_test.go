package storedsn_test

import (
	"context"
	"fmt"

	"github.com/retrysafe/retrysafe/storedsn"
)

// Open a store from the string an operator passes to --store.
func ExampleOpen() {
	ctx := context.Background()
	o, err := storedsn.Open(ctx, "memory:", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer o.Close()
	if err := o.Migrate(ctx); err != nil { // creates tables; nothing to do for memory:
		fmt.Println(err)
		return
	}
	fmt.Println(o.Kind, o.Name, o.Janitor != nil)

	_, err = storedsn.Open(ctx, "mysql://db/app", nil)
	fmt.Println(err)
	// Output:
	// memory memory: true
	// storedsn: unknown store "mysql://db/app": want sqlite:PATH, postgres://…, redis://… or memory:
}
