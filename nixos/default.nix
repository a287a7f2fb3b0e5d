# services.holdfast.{arbiter,controller,tailer,etcd,provision}.
{
  imports = [
    ./arbiter.nix
    ./controller.nix
    ./tailer.nix
    ./etcd.nix
    ./provision.nix
  ];
}
