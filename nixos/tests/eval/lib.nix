# A small stand-in for nixpkgs' `lib`, enough for the holdfast modules and
# no more (nixpkgs is not reachable on the machines that run the tests).
# It is evaluated by `nix-instantiate --eval` in tests/tests/nixos.rs.
# Semantics follow nixpkgs where the modules depend on them: options with
# types that check definitions, mkIf/mkMerge pushed down to the options they
# define (so `config = mkIf cfg.enable { ... }` does not recurse),
# priorities (mkDefault < plain < mkForce), submodules with a freeformType.
let
  inherit (builtins)
    all any attrNames concatMap concatStringsSep elem elemAt filter foldl'
    genList head isAttrs isBool isFloat isFunction isInt isList isPath
    isString length listToAttrs mapAttrs toJSON
    ;

  kind = d: if isAttrs d && d ? _type then d._type else null;

  showLoc = loc: concatStringsSep "." loc;

  unique = foldl' (acc: x: if elem x acc then acc else acc ++ [ x ]) [ ];

  filterAttrs =
    pred: set:
    listToAttrs (
      concatMap (n: if pred n set.${n} then [ { name = n; value = set.${n}; } ] else [ ]) (attrNames set)
    );

  # Definitions of one option, with mkIf/mkMerge/mkOverride resolved: only
  # those of the highest priority (lowest number) count.
  discharge =
    defs:
    let
      flat =
        prio: d:
        let
          k = kind d;
        in
        if k == "merge" then
          concatMap (flat prio) d.contents
        else if k == "if" then
          (if d.condition then flat prio d.content else [ ])
        else if k == "override" then
          flat d.priority d.content
        else
          [ { inherit prio; value = d; } ];
      all' = concatMap (flat 100) defs;
      best = foldl' (m: f: if f.prio < m then f.prio else m) 10000 all';
    in
    map (f: f.value) (filter (f: f.prio == best) all');

  # An attribute set definition with mkIf/mkMerge/mkOverride around it
  # becomes plain attribute sets whose values carry the condition.
  pushDown =
    d:
    let
      k = kind d;
    in
    if k == "merge" then
      concatMap pushDown d.contents
    else if k == "if" then
      map (mapAttrs (_: v: lib.mkIf d.condition v)) (pushDown d.content)
    else if k == "override" then
      map (mapAttrs (_: v: lib.mkOverride d.priority v)) (pushDown d.content)
    else if isAttrs d then
      [ d ]
    else
      throw "a definition of an option set is not an attribute set: ${toJSON d}";

  isOption = d: kind d == "option";

  typeError =
    loc: t: v:
    throw "A definition for option `${showLoc loc}' is not of type `${t.description}': ${
      builtins.typeOf v
    }";

  checked =
    t: loc: defs:
    let
      bad = filter (v: !(t.check v)) defs;
    in
    if bad == [ ] then defs else typeError loc t (head bad);

  mergeEqual =
    t: loc: defs:
    let
      ds = checked t loc defs;
      first = head ds;
    in
    if all (d: d == first) ds then
      first
    else
      throw "The option `${showLoc loc}' has conflicting definitions: ${toJSON ds}";

  mkType =
    a:
    let
      t = {
        _type = "type";
        check = _: true;
        description = a.name;
        merge = mergeEqual t;
      } // a;
    in
    t;

  # The options below `decls` (nested attribute sets of options), given the
  # definitions `defs` of that level; names nobody declared go to
  # `freeform` (a type) or are an error, as in nixpkgs.
  evalTree =
    loc: decls: defs: freeform:
    let
      pushed = concatMap pushDown defs;
      names = unique (concatMap attrNames pushed);
      undeclared = filter (n: !(decls ? ${n})) names;
      sub = n: concatMap (d: if d ? ${n} then [ d.${n} ] else [ ]) pushed;
      declared = mapAttrs (
        n: decl:
        if isOption decl then evalOption (loc ++ [ n ]) decl (sub n) else evalTree (loc ++ [ n ]) decl (sub n) null
      ) decls;
      free =
        if undeclared == [ ] then
          { }
        else if freeform == null then
          throw "The option `${showLoc (loc ++ [ (head undeclared) ])}' does not exist."
        else
          freeform.merge loc (
            filter (d: d != { }) (map (d: filterAttrs (n: _: elem n undeclared) d) pushed)
          );
    in
    free // declared;

  evalOption =
    loc: decl: defs:
    let
      vals = discharge defs;
      final =
        if vals != [ ] then
          vals
        else if decl ? default then
          [ decl.default ]
        else
          throw "The option `${showLoc loc}' is used but not defined.";
    in
    decl.type.merge loc final;

  mergeDecls =
    a: b:
    a
    // mapAttrs (
      n: v:
      if !(a ? ${n}) then
        v
      else if isOption v || isOption a.${n} then
        throw "The option `${n}' is declared twice."
      else
        mergeDecls a.${n} v
    ) b;

  # Recursive values: attribute sets merge name by name, lists concatenate,
  # anything else must be defined equally everywhere.
  mergeAny =
    t: loc: defs:
    let
      ds = checked t loc (discharge defs);
    in
    if ds != [ ] && all isAttrs ds && !(any (d: d ? outPath) ds) then
      let
        names = unique (concatMap attrNames ds);
      in
      listToAttrs (
        map (n: {
          name = n;
          value = mergeAny t (loc ++ [ n ]) (concatMap (d: if d ? ${n} then [ d.${n} ] else [ ]) ds);
        }) names
      )
    else if ds != [ ] && all isList ds then
      concatMap (x: x) ds
    else
      mergeEqual t loc ds;

  types = rec {
    anything = mkType {
      name = "anything";
      merge = mergeAny anything;
    };
    unspecified = anything;
    bool = mkType {
      name = "boolean";
      check = isBool;
    };
    str = mkType {
      name = "string";
      check = isString;
    };
    int = mkType {
      name = "signed integer";
      check = isInt;
    };
    float = mkType {
      name = "float";
      check = isFloat;
    };
    port = mkType {
      name = "16 bit unsigned integer";
      check = v: isInt v && v >= 0 && v <= 65535;
    };
    path = mkType {
      name = "path";
      check = v: isPath v || (isString v && builtins.substring 0 1 v == "/") || (isAttrs v && v ? outPath);
    };
    package = mkType {
      name = "package";
      check = v: isAttrs v && v ? outPath;
    };
    lines = mkType {
      name = "strings concatenated with \"\\n\"";
      check = isString;
      merge = loc: defs: concatStringsSep "\n" (checked lines loc defs);
    };
    strMatching =
      re:
      mkType {
        name = "string matching the pattern ${re}";
        check = v: isString v && builtins.match re v != null;
      };
    enum =
      vals:
      mkType {
        name = "one of ${concatStringsSep ", " (map toJSON vals)}";
        check = v: elem v vals;
      };
    nullOr =
      t:
      mkType {
        name = "null or ${t.description}";
        check = v: v == null || t.check v;
        merge =
          loc: defs:
          if all (d: d == null) defs then
            null
          else if any (d: d == null) defs then
            throw "The option `${showLoc loc}' is defined both null and not null."
          else
            t.merge loc defs;
      };
    listOf =
      t:
      let
        self = mkType {
          name = "list of ${t.description}";
          check = isList;
          getSubOptions = t.getSubOptions or { };
          merge =
            loc: defs:
            let
              items = concatMap (x: x) (checked self loc defs);
            in
            genList (i: t.merge (loc ++ [ "[${toString i}]" ]) (discharge [ (elemAt items i) ])) (length items);
        };
      in
      self;
    attrsOf =
      t:
      let
        self = mkType {
          name = "attribute set of ${t.description}";
          check = isAttrs;
          getSubOptions = t.getSubOptions or { };
          merge =
            loc: defs:
            let
              ds = checked self loc (concatMap pushDown defs);
              names = unique (concatMap attrNames ds);
              vals = n: discharge (concatMap (d: if d ? ${n} then [ d.${n} ] else [ ]) ds);
            in
            listToAttrs (
              concatMap (
                n:
                let
                  v = vals n;
                in
                if v == [ ] then [ ] else [ { name = n; value = t.merge (loc ++ [ n ]) v; } ]
              ) names
            );
        };
      in
      self;
    lazyAttrsOf = attrsOf;
    # `m`: { options, freeformType ? null } or a function of { name } to it.
    submodule =
      m:
      mkType {
        name = "submodule";
        check = isAttrs;
        getSubOptions = (if isFunction m then m { name = "<name>"; } else m).options or { };
        merge =
          loc: defs:
          let
            mod = if isFunction m then m { name = lib.last loc; } else m;
          in
          evalTree loc (mod.options or { }) (checked (submodule m) loc defs) (mod.freeformType or null);
      };
  };

  lib = {
    inherit
      types
      filterAttrs
      unique
      all
      any
      attrNames
      concatMap
      concatStringsSep
      elem
      filter
      length
      mapAttrs
      ;
    attrValues = builtins.attrValues;
    mapAttrsToList = f: set: map (n: f n set.${n}) (attrNames set);
    concatMapStringsSep = sep: f: xs: concatStringsSep sep (map f xs);
    optional = c: x: if c then [ x ] else [ ];
    optionals = c: xs: if c then xs else [ ];
    optionalAttrs = c: set: if c then set else { };
    optionalString = c: s: if c then s else "";
    hasPrefix = p: s: builtins.substring 0 (builtins.stringLength p) s == p;
    splitString = sep: s: filter isString (builtins.split sep s);
    last = xs: elemAt xs (length xs - 1);
    toInt = s: builtins.fromJSON s;
    escapeShellArg = s: "'" + builtins.replaceStrings [ "'" ] [ "'\\''" ] (toString s) + "'";
    literalExpression = text: {
      _type = "literalExpression";
      inherit text;
    };
    importTOML = p: builtins.fromTOML (builtins.readFile p);
    cleanSource = p: p;
    maintainers = { };
    licenses.asl20 = "Apache-2.0";
    platforms.linux = [ "x86_64-linux" "aarch64-linux" ];

    mkOption = a: a // { _type = "option"; };
    mkEnableOption =
      name:
      lib.mkOption {
        type = types.bool;
        default = false;
        description = "Whether to enable ${name}.";
      };
    mkIf = condition: content: {
      _type = "if";
      inherit condition content;
    };
    mkMerge = contents: {
      _type = "merge";
      inherit contents;
    };
    mkOverride = priority: content: {
      _type = "override";
      inherit priority content;
    };
    mkDefault = lib.mkOverride 1000;
    mkForce = lib.mkOverride 50;

    # The module system: modules are functions of { config, lib, pkgs,
    # options, ... } or attribute sets, with options/config/imports (or a
    # bare config).
    evalModules =
      {
        modules,
        specialArgs ? { },
      }:
      let
        args = specialArgs // {
          inherit lib config;
          options = decls;
        };
        collect =
          m:
          let
            raw = if isPath m || isString m then import m else m;
            val = if isFunction raw then raw args else raw;
            structured = val ? options || val ? config || val ? imports;
          in
          [
            {
              options = val.options or { };
              config = if structured then val.config or { } else removeAttrs val [ "imports" ];
            }
          ]
          ++ concatMap collect (val.imports or [ ]);
        all' = concatMap collect modules;
        decls = foldl' mergeDecls { } (map (m: m.options) all');
        config = evalTree [ ] decls (map (m: m.config) all') null;
      in
      {
        inherit config;
        options = decls;
      };
  };
in
lib
