package patch_test

import (
	"fmt"

	"github.com/agentloom/loomfs/patch"
)

func Example() {
	files, err := patch.Parse(`*** Begin Patch
*** Update File: hello.py
@@ def greet():
-    print("hello")
+    print("hello, world")
*** End Patch`)
	if err != nil {
		panic(err)
	}
	out, err := patch.Apply("def greet():\n    print(\"hello\")\n", files[0].Hunks)
	fmt.Print(out, err)
	// Output:
	// def greet():
	//     print("hello, world")
	// <nil>
}
